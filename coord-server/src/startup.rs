//! Start-up checks: the Redis version and every command the coordinator and the SDKs need.
//!
//! A missing or renamed command fails start-up with a message naming it, before any client depends on it.
//! On a Redis Cluster every master is checked (each may run another version or configuration), and a failure
//! names the node. There is no fallback: each command below is needed for correctness (XAUTOCLAIM, for instance, is how a new
//! owner takes over the entries a previous owner left pending).

use client_core::redis_check::{check_commands, check_version, Incompatibility};

use crate::error::StoreError;
use crate::store::Store;

/// Oldest supported Redis version (XAUTOCLAIM arrived in 6.2): the SDKs' own minimum, checked by the same rule.
pub use client_core::redis_check::MIN_REDIS_VERSION;

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
    ("HSTRLEN", "C: field lengths a cached load compares"),
    ("HLEN", "C: field count a cached load compares"),
    ("EXISTS", "C: group existence"),
    ("SET", "C: mutex"),
    ("GET", "C: mutex release"),
    ("DEL", "C: mutex release"),
    ("SCAN", "C: index rebuild"),
    ("SADD", "C: index"),
    ("SMEMBERS", "C: index"),
    ("ZADD", "C: due index"),
    ("ZREM", "C: due index"),
    ("ZRANGEBYSCORE", "C: due index (in a script)"),
    ("XADD", "P: publishing"),
    ("XGROUP", "K: consumer group creation"),
    ("XREADGROUP", "K: reading"),
    ("XACK", "K: acknowledging"),
    ("XAUTOCLAIM", "K: re-delivering a previous owner's pending entries"),
    ("XCLAIM", "K: counting a handler retry as a delivery"),
    ("XINFO", "C: lag and pending metrics (XINFO GROUPS)"),
    ("XLEN", "C: shard length metric"),
    ("XPENDING", "K: delivery counts"),
    ("CLIENT", "K: SETNAME naming a blocking read's connection"),
    ("MULTI", "K: dead letter and acknowledgement in one transaction"),
    ("EXEC", "K: dead letter and acknowledgement in one transaction"),
];

/// Checks the server version and commands (of every master on a cluster), of the data Redis too when the metadata
/// has a Redis of its own.
///
/// # Errors
/// [`StoreError::Unsupported`] naming the version or command (inside [`StoreError::Node`] naming the node on a
/// cluster); Redis errors.
pub async fn check_redis(store: &Store) -> Result<(), StoreError> {
    check_one(store).await?;
    if store.split() {
        // The data Redis serves the SDKs and the seals; the metadata Redis the scripts: both are checked in full.
        check_one(store.data()).await?;
    }
    Ok(())
}

async fn check_one(store: &Store) -> Result<(), StoreError> {
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

/// Checks one server's `INFO server` text and which of [`REQUIRED_COMMANDS`] it offers, by the SDKs' rule
/// (`client_core::redis_check`).
fn check_node(info: &str, present: Vec<bool>) -> Result<(), StoreError> {
    check_version(info, MIN_REDIS_VERSION)
        .and_then(|_| check_commands(REQUIRED_COMMANDS, present))
        .map_err(|e| {
            StoreError::Unsupported(match e {
                // The coordinator names the command that sets the minimum.
                Incompatibility::TooOld { .. } => format!("{e} (XAUTOCLAIM)"),
                _ => e.to_string(),
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_version_and_the_missing_commands() {
        let all = vec![true; REQUIRED_COMMANDS.len()];
        assert!(check_node("redis_version:7.0.15\r\n", all.clone()).is_ok());
        let err = check_node("redis_version:6.0.9\r\n", all).expect_err("6.0 is too old");
        assert_eq!(
            err.to_string(),
            StoreError::Unsupported("Redis 6.0.9 is too old: 6.2 or newer is required (XAUTOCLAIM)".into()).to_string()
        );
        let present = REQUIRED_COMMANDS
            .iter()
            .map(|(name, _)| *name != "XAUTOCLAIM")
            .collect();
        let err = check_node("redis_version:7.0.15\r\n", present).expect_err("XAUTOCLAIM is absent");
        assert!(
            err.to_string()
                .contains("Redis lacks required commands (missing or renamed): XAUTOCLAIM ("),
            "{err}"
        );
    }
}

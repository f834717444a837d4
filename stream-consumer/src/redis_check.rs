//! The start-up check of the shard streams' Redis, run before the member joins a group (and again before it
//! rejoins after giving its shards back).

use client_core::redis_check::{check_redis as check_server, RedisRequirements, MIN_REDIS_VERSION};
use client_core::RedisFailure;
use redis::AsyncConnectionConfig;

use redis_link::Nodes;

use crate::redis_nodes::CONNECT_TIMEOUT;

use crate::config::ConsumerConfig;
use crate::error::{ConsumerError, RedisUnusableReason};

/// What the consumer needs from the shard streams' Redis: checked before it joins a group (and again before it
/// rejoins after giving its shards back).
pub const REDIS_REQUIREMENTS: RedisRequirements = RedisRequirements {
    min_version: MIN_REDIS_VERSION,
    commands: &[
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
    ],
};

/// The start-up check of the shard streams' Redis: reachable, 6.2 or newer, every command the consumer sends; on
/// a cluster, every master (a shard may be on any of them). Bounded by the connection timeout plus two response
/// timeouts per server.
pub(crate) async fn check_redis(nodes: &Nodes, config: &ConsumerConfig) -> Result<(), ConsumerError> {
    let response_timeout = config.timings.redis_response_timeout;
    let connection = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(response_timeout));
    let unusable = |node: Option<&redis_link::NodeAddr>, reason: RedisUnusableReason| ConsumerError::RedisUnusable {
        url: match node {
            None => protocol::redact::redact_url(&config.redis_url),
            Some(node) => format!("{} (node {node})", protocol::redact::redact_url(&config.redis_url)),
        },
        reason,
    };
    let bound = CONNECT_TIMEOUT + response_timeout * 2;
    let targets = tokio::time::timeout(bound, nodes.check_targets())
        .await
        .map_err(|_| unusable(None, RedisUnusableReason::TimedOut(bound)))?
        .map_err(|e| unusable(None, RedisUnusableReason::Connect(RedisFailure::from_redis(e))))?;
    for (node, client) in targets {
        let check = async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&connection)
                .await
                .map_err(|e| unusable(node.as_ref(), RedisUnusableReason::Connect(RedisFailure::from_redis(e))))?;
            check_server(&mut conn, &config.redis_url, &REDIS_REQUIREMENTS)
                .await
                .map(|_| ())
                .map_err(|e| unusable(node.as_ref(), RedisUnusableReason::Check(e)))
        };
        tokio::time::timeout(bound, check)
            .await
            .map_err(|_| unusable(node.as_ref(), RedisUnusableReason::TimedOut(bound)))??;
    }
    Ok(())
}

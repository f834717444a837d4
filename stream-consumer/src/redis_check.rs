//! The start-up check of the shard streams' Redis, run before the member joins a group (and again before it
//! rejoins after giving its shards back).

use client_core::redis_check::{check_redis as check_server, RedisRequirements, MIN_REDIS_VERSION};
use redis::AsyncConnectionConfig;
use std::time::Duration;

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

/// The start-up check of the shard streams' Redis: reachable, 6.2 or newer, every command the consumer sends.
/// Bounded by the connection timeout plus two response timeouts.
pub(crate) async fn check_redis(redis: &redis::Client, config: &ConsumerConfig) -> Result<(), ConsumerError> {
    let response_timeout = config.timings.redis_response_timeout;
    let connection = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(response_timeout));
    let unusable = |reason: RedisUnusableReason| ConsumerError::RedisUnusable {
        url: protocol::redact::redact_url(&config.redis_url),
        reason,
    };
    let check = async {
        let mut conn = redis
            .get_multiplexed_async_connection_with_config(&connection)
            .await
            .map_err(|e| unusable(RedisUnusableReason::Connect(e)))?;
        check_server(&mut conn, &config.redis_url, &REDIS_REQUIREMENTS)
            .await
            .map(|_| ())
            .map_err(|e| unusable(RedisUnusableReason::Check(e)))
    };
    let bound = Duration::from_secs(2) + response_timeout * 2;
    tokio::time::timeout(bound, check)
        .await
        .map_err(|_| unusable(RedisUnusableReason::TimedOut(bound)))?
}

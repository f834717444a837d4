//! Reading what a consumer group left in its shard streams.

use crate::RedisServer;

/// The group's pending entries summed over `shard_keys` (the count of each `XPENDING` summary; a stream or group
/// that does not exist counts 0).
pub async fn pending_total(redis: &RedisServer, shard_keys: impl IntoIterator<Item = String>, group: &str) -> u64 {
    let mut con = redis.connection().await;
    let mut total = 0;
    for key in shard_keys {
        let r: redis::RedisResult<redis::Value> =
            redis::cmd("XPENDING").arg(key).arg(group).query_async(&mut con).await;
        if let Ok(redis::Value::Array(items)) = r {
            if let Some(redis::Value::Int(n)) = items.first() {
                total += u64::try_from(*n).unwrap_or(0);
            }
        }
    }
    total
}

//! A token's group-create mutex (`protocol::keys::quota_mutex`): one string key taken with `SET NX PX`, renewed
//! and deleted only by the token that holds it (compare-and-set scripts). The coordinator's use of it, and why it
//! is safe across replicas, is in `coordinator/quota/lock.rs`.
//!
//! In front of it, a local queue per key ([`Store::quota_queue`]): the creates of one token on this process take
//! turns there, and only the first asks Redis. Without it every waiter polls Redis, and waiters that started
//! together back off together, so the mutex sat free between their polls (50 waiters took about 25 ms a turn).

use redis::Script;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex as StdMutex};
use std::time::Duration;

/// The local queues, by mutex key: one entry per token that ever created a group here (bounded by the token
/// table).
pub(super) type Queues = Arc<StdMutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>;

use super::Store;
use crate::error::StoreError;

/// Extends the mutex's TTL while `ARGV[1]` holds it; answers 1, or 0 when another holder (or none) has it. `SET
/// XX PX`, not `PEXPIRE`: the coordinator's ACL user (`deploy/redis/users.acl`) may `SET` its keys, and a script's
/// commands are checked against it.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'XX', 'PX', ARGV[2])
  return 1
end
return 0",
    )
});

/// Deletes the mutex while `ARGV[1]` holds it (a mutex that expired and was taken by another stays theirs). The
/// ACL user may `DEL` `redis-stream:coord:*mutex`.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0",
    )
});

/// Milliseconds for `PX`, at least 1.
fn px(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Store {
    /// This process's queue for the mutex `key`: hold it while waiting for and holding the mutex.
    pub fn quota_queue(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut queues = self.quota_queues.lock().expect("quota queues lock");
        queues.entry(key.to_owned()).or_default().clone()
    }

    /// Takes the mutex `key` for `token` for `ttl` (`SET NX PX`). `Ok(false)`: another holder has it.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn try_take_quota_mutex(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(px(ttl))
            .query_async(&mut conn)
            .await?;
        Ok(set.is_some())
    }

    /// Gives the mutex `key` a fresh `ttl` while `token` holds it. `Ok(false)`: it is no longer `token`'s.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn renew_quota_mutex(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let renewed: i64 = RENEW.key(key).arg(token).arg(px(ttl)).invoke_async(&mut conn).await?;
        Ok(renewed == 1)
    }

    /// Deletes the mutex `key` while `token` holds it.
    ///
    /// # Errors
    /// Redis errors (the mutex then expires by its TTL).
    pub async fn release_quota_mutex(&self, key: &str, token: &str) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: i64 = RELEASE.key(key).arg(token).invoke_async(&mut conn).await?;
        Ok(())
    }
}

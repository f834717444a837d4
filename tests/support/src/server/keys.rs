//! The rollback helpers of a [`RedisServer`]: one key dumped and restored, or every key matching a pattern as a
//! [`Snapshot`].

use redis::aio::MultiplexedConnection;
use redis::Value;

use super::RedisServer;
use crate::snapshot::{Snapshot, SnapshotEntry};

impl RedisServer {
    /// Serialises `key` with `DUMP`; `None` if the key does not exist.
    ///
    /// The dump does not include the key's time to live (see
    /// [`snapshot_keys`](Self::snapshot_keys) for that).
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if the command fails.
    pub async fn dump_key(&self, key: &str) -> Option<Vec<u8>> {
        let mut con = self.connection().await;
        self.query(&mut con, redis::cmd("DUMP").arg(key), "DUMP").await
    }

    /// Writes `dump` (from [`dump_key`](Self::dump_key)) back to `key` with
    /// `RESTORE key 0 dump REPLACE`: the key gets exactly the dumped value and
    /// no expiry.
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if the command fails, e.g. because the
    /// dump is corrupt or from an incompatible Redis version.
    pub async fn restore_key(&self, key: &str, dump: &[u8]) {
        let mut con = self.connection().await;
        self.query::<()>(
            &mut con,
            redis::cmd("RESTORE").arg(key).arg(0).arg(dump).arg("REPLACE"),
            "RESTORE",
        )
        .await;
    }

    /// Deletes `key` (`DEL`); the rollback for a key that did not exist when
    /// it was dumped.
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if the command fails.
    pub async fn delete_key(&self, key: &str) {
        let mut con = self.connection().await;
        self.query::<()>(&mut con, redis::cmd("DEL").arg(key), "DEL").await;
    }

    /// Puts `key` back to the state captured by [`dump_key`](Self::dump_key):
    /// restores `Some(dump)` and deletes the key for `None`.
    ///
    /// # Panics
    ///
    /// As [`restore_key`](Self::restore_key).
    pub async fn restore_dump(&self, key: &str, dump: Option<&[u8]>) {
        match dump {
            Some(dump) => self.restore_key(key, dump).await,
            None => self.delete_key(key).await,
        }
    }

    /// Captures every key matching the glob `pattern` (found with `SCAN`),
    /// with its value (`DUMP`) and remaining time to live (`PTTL`).
    ///
    /// The keys are read in one `MULTI`/`EXEC`, so related keys (e.g. a
    /// group's metadata hash and its liveness hash) are captured at the same
    /// instant. Keys created between the `SCAN` and the `EXEC` are not
    /// captured; keys deleted in that window are treated as absent.
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if a command fails.
    pub async fn snapshot_keys(&self, pattern: &str) -> Snapshot {
        let mut con = self.connection().await;
        let keys = self.scan(&mut con, pattern).await;
        let mut entries = Vec::with_capacity(keys.len());
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for key in &keys {
                pipe.cmd("DUMP").arg(key).cmd("PTTL").arg(key);
            }
            let replies: Vec<Value> = pipe
                .query_async(&mut con)
                .await
                .unwrap_or_else(|e| self.fail(format_args!("snapshot of {pattern:?} failed: {e}")));
            if replies.len() != keys.len() * 2 {
                self.fail(format_args!(
                    "snapshot of {pattern:?}: expected {} replies, got {}",
                    keys.len() * 2,
                    replies.len()
                ));
            }
            for (key, pair) in keys.into_iter().zip(replies.chunks_exact(2)) {
                let dump: Option<Vec<u8>> = redis::from_redis_value_ref(&pair[0])
                    .unwrap_or_else(|e| self.fail(format_args!("unexpected DUMP reply for {key:?}: {e}")));
                let pttl: i64 = redis::from_redis_value_ref(&pair[1])
                    .unwrap_or_else(|e| self.fail(format_args!("unexpected PTTL reply for {key:?}: {e}")));
                if let Some(dump) = dump {
                    let ttl_ms = u64::try_from(pttl).ok().filter(|ttl| *ttl > 0);
                    entries.push(SnapshotEntry { key, dump, ttl_ms });
                }
            }
        }
        Snapshot {
            pattern: pattern.to_owned(),
            entries,
        }
    }

    /// Rolls every key matching the snapshot's pattern back to the snapshot:
    /// captured keys are restored (`RESTORE ... REPLACE`, with the time to
    /// live they had left when captured) and matching keys that did not exist
    /// in the snapshot are deleted. Keys outside the pattern are untouched.
    ///
    /// All changes are applied in one `MULTI`/`EXEC`. The snapshot may come
    /// from another server (e.g. restore a primary's state on a replica).
    ///
    /// # Panics
    ///
    /// Panics (with the server log) if a command fails.
    pub async fn restore_snapshot(&self, snapshot: &Snapshot) {
        let mut con = self.connection().await;
        let current = self.scan(&mut con, &snapshot.pattern).await;
        let mut pipe = redis::pipe();
        pipe.atomic();
        for key in current.iter().filter(|key| !snapshot.contains(key)) {
            pipe.cmd("DEL").arg(key).ignore();
        }
        for entry in &snapshot.entries {
            pipe.cmd("RESTORE")
                .arg(&entry.key)
                .arg(entry.ttl_ms.unwrap_or(0))
                .arg(&entry.dump)
                .arg("REPLACE")
                .ignore();
        }
        let _: () = pipe.query_async(&mut con).await.unwrap_or_else(|e| {
            self.fail(format_args!(
                "restoring the snapshot of {:?} failed: {e}",
                snapshot.pattern
            ))
        });
    }

    /// All keys matching `pattern`, without duplicates, sorted.
    async fn scan(&self, con: &mut MultiplexedConnection, pattern: &str) -> Vec<String> {
        let mut keys = std::collections::BTreeSet::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = self
                .query(
                    con,
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(1000),
                    "SCAN",
                )
                .await;
            keys.extend(batch);
            if next == 0 {
                return keys.into_iter().collect();
            }
            cursor = next;
        }
    }
}

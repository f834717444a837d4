//! The rebuildable indexes of groups and streams: two Redis sets, written when a group is created and rebuilt by
//! `SCAN` when lost.

use protocol::keys;
use protocol::names::{GroupName, StreamName};

use super::Store;
use crate::error::StoreError;

impl Store {
    /// Adds a group to the rebuildable groups index (and its stream to the streams index).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn index_group(&self, stream: &StreamName, group: &GroupName) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        // Two commands, not one pipeline: the two sets have no tag, so on a cluster they lie in two slots. The
        // indexes are rebuildable (SCAN), so nothing needs them written together.
        let _: () = redis::cmd("SADD")
            .arg(keys::groups_index())
            .arg(keys::groups_index_member(stream, group))
            .query_async(&mut conn)
            .await?;
        let _: () = redis::cmd("SADD")
            .arg(keys::streams_index())
            .arg(stream.as_str())
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// The groups index members (`stream:group`).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn indexed_groups(&self) -> Result<Vec<String>, StoreError> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("SMEMBERS")
            .arg(keys::groups_index())
            .query_async(&mut conn)
            .await?)
    }

    /// Rebuilds the groups index by scanning metadata keys (on every master of a cluster: `SCAN` sees one
    /// node's keys). Returns the `stream:group` pairs found.
    ///
    /// # Errors
    /// Redis errors, naming the cluster node.
    pub async fn rebuild_index(&self) -> Result<Vec<String>, StoreError> {
        let mut found = Vec::new();
        for mut node in self.each_master().await? {
            let mut cursor: u64 = 0;
            loop {
                let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(keys::group_metadata_pattern())
                    .arg("COUNT")
                    .arg(500)
                    .query_async(&mut node.conn)
                    .await
                    .map_err(|e| node.failed(e.into()))?;
                for key in batch {
                    let tag = keys::hash_tag(&key);
                    if tag != key {
                        found.push(tag.to_owned());
                    }
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        found.sort();
        found.dedup();
        let mut conn = self.conn.clone();
        if !found.is_empty() {
            let _: () = redis::cmd("SADD")
                .arg(keys::groups_index())
                .arg(&found)
                .query_async(&mut conn)
                .await?;
        }
        Ok(found)
    }
}

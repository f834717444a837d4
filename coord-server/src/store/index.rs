//! The rebuildable indexes of groups and streams: two Redis sets, written when a group is created and rebuilt by
//! `SCAN` when lost; and the replacement of an index (these sets, or the due index) found of the wrong type.

use protocol::keys;
use protocol::names::{GroupName, StreamName};
use redis::Script;

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
        let found = self.scan_groups().await?;
        self.add_to_groups_index(&found).await?;
        Ok(found)
    }

    /// The `stream:group` pairs of every group metadata key, by `SCAN` (on every master of a cluster), sorted:
    /// what the groups index holds when nothing was lost, read without it.
    ///
    /// # Errors
    /// Redis errors, naming the cluster node.
    pub async fn scan_groups(&self) -> Result<Vec<String>, StoreError> {
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
        Ok(found)
    }

    /// Adds `members` to the groups index; returns how many it lacked.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn add_to_groups_index(&self, members: &[String]) -> Result<u64, StoreError> {
        if members.is_empty() {
            return Ok(0);
        }
        let mut conn = self.conn.clone();
        Ok(redis::cmd("SADD")
            .arg(keys::groups_index())
            .arg(members)
            .query_async(&mut conn)
            .await?)
    }

    /// Replaces a groups index of the wrong type by a set of `members` (see [`Store::replace_of_wrong_type`]).
    ///
    /// # Errors
    /// Redis errors (`NOPERM` where the ACL lacks `TYPE` or `DEL` on the key).
    pub async fn replace_groups_index_of_wrong_type(&self, members: &[String]) -> Result<bool, StoreError> {
        self.replace_of_wrong_type(&keys::groups_index(), "set", members).await
    }

    /// Replaces a due index of the wrong type by a sorted set of `members`, each at score 0 (due at once; see
    /// [`Store::replace_of_wrong_type`]).
    ///
    /// # Errors
    /// Redis errors (`NOPERM` where the ACL lacks `TYPE` or `DEL` on the key).
    pub async fn replace_due_index_of_wrong_type(&self, members: &[String]) -> Result<bool, StoreError> {
        self.replace_of_wrong_type(&keys::due_index(), "zset", members).await
    }

    /// Replaces `key` when it holds another type than `kind` (as `TYPE` names it) by one holding `members`, in
    /// one script, so no reader sees it half written; leaves a key of the right type, or none, untouched (another
    /// replica repaired it first). Returns whether it replaced the key.
    async fn replace_of_wrong_type(&self, key: &str, kind: &str, members: &[String]) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let replaced: i64 = Script::new(REPLACE_WRONG_TYPE)
            .key(key)
            .arg(kind)
            .arg(members)
            .invoke_async(&mut conn)
            .await?;
        Ok(replaced == 1)
    }
}

/// `KEYS[1]` of another type than `ARGV[1]` (and not missing) is deleted and written again with `ARGV[2..]`, in
/// batches that stay below Lua's limit on `unpack`.
const REPLACE_WRONG_TYPE: &str = r"
local t = redis.call('TYPE', KEYS[1]).ok
if t == ARGV[1] or t == 'none' then return 0 end
redis.call('DEL', KEYS[1])
local batch = {}
local function flush()
  if #batch == 0 then return end
  if ARGV[1] == 'zset' then redis.call('ZADD', KEYS[1], unpack(batch)) else redis.call('SADD', KEYS[1], unpack(batch)) end
  batch = {}
end
for i = 2, #ARGV do
  if ARGV[1] == 'zset' then batch[#batch + 1] = '0' end
  batch[#batch + 1] = ARGV[i]
  if #batch >= 1000 then flush() end
end
flush()
return 1
";

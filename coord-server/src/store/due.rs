//! The due index (`redis-stream:coord:due`): a sorted set of groups scored by the Redis time each next needs a
//! tick. Shared by every coordinator replica; rebuildable (the tick's sweep re-scores every group), so it is
//! written with plain commands, outside the groups' critical sections.

use protocol::keys;
use protocol::names::{GroupName, StreamName};
use protocol::StoreRevision;
use redis::Script;

use super::Store;
use crate::error::StoreError;

/// Redis time and the members due by it, in one round trip: the time is the due key's node's own, so a member
/// scored by that node's clock is never read early or late by another's.
const DUE_NOW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now), 'LIMIT', 0, tonumber(ARGV[1]))
return {string.format('%d', now), due}
";

/// One group's score: the Redis time (ms) it is next due, `None` for no deadline (`+inf`).
pub type DueScore = (String, Option<u64>);

impl Store {
    /// Redis time (ms) and up to `limit` groups (groups index members) due by then, earliest first.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn due_groups(&self, limit: usize) -> Result<(u64, Vec<String>), StoreError> {
        let mut conn = self.conn.clone();
        let (now, due): (String, Vec<String>) = Script::new(DUE_NOW)
            .key(keys::due_index())
            .arg(limit)
            .invoke_async(&mut conn)
            .await?;
        let now = now
            .parse()
            .map_err(|_| StoreError::Protocol(format!("due index: TIME gave {now:?}")))?;
        Ok((now, due))
    }

    /// Records the scores of several groups in one `ZADD` (plain, not `LT`: a deadline moves later after a
    /// visit). Does nothing for an empty list. Returns how many of the groups the index lacked (`ZADD`'s count of
    /// new members).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn set_due(&self, scores: &[DueScore]) -> Result<u64, StoreError> {
        if scores.is_empty() {
            return Ok(0);
        }
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(keys::due_index());
        for (member, score) in scores {
            match score {
                Some(ms) => cmd.arg(*ms),
                None => cmd.arg("+inf"),
            };
            cmd.arg(member);
        }
        let mut conn = self.conn.clone();
        Ok(cmd.query_async(&mut conn).await?)
    }

    /// The revision of a group's metadata hash (`None`: no hash, or a revision this build cannot read; the
    /// caller takes either as "changed").
    ///
    /// # Errors
    /// Redis errors.
    pub async fn revision(&self, stream: &StreamName, group: &GroupName) -> Result<Option<StoreRevision>, StoreError> {
        let mut conn = self.conn.clone();
        let rev: Option<String> = redis::cmd("HGET")
            .arg(keys::group_metadata(stream, group))
            .arg(keys::fields::REVISION)
            .query_async(&mut conn)
            .await?;
        Ok(rev.and_then(|r| r.parse().ok()).map(StoreRevision))
    }

    /// Removes groups from the due index (their metadata is gone; the sweep scores them again if it comes back).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn clear_due(&self, members: &[String]) -> Result<(), StoreError> {
        if members.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        let _: i64 = redis::cmd("ZREM")
            .arg(keys::due_index())
            .arg(members)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }
}

//! The Redis side of resharding (see `docs/resharding.md`): the seal of a parent shard and the observation of a
//! group's drain of it. Both are one script on keys of the shard's own hash slot (the shard stream and its fence),
//! so they are atomic with the producers' writes and run unchanged on a Cluster.

use protocol::keys::{self, shard_fence_fields};
use protocol::names::{GroupName, StreamName};
use protocol::reshard::EntryId;
use protocol::{RoutingVersion, ShardId};
use redis::{Script, Value};
use std::sync::LazyLock;

use crate::error::StoreError;

/// Sets the fence to the growth's version (never lowers it) and answers the last entry id the stream generated at
/// that instant (`0-0` for a missing stream). Nothing can be written between the two: every entry after the answer
/// was written by a producer holding at least that version.
///
/// KEYS: shard stream, shard fence. ARGV: routing version, fence field.
/// Answers `{seal position, fence before (or false)}`.
const SEAL: &str = r#"
local v = ARGV[1]
local cur = redis.call('HGET', KEYS[2], ARGV[2])
if cur and not (#cur <= 15 and string.find(cur, '^%d+$')) then
  return redis.error_reply('CORRUPT fence ' .. KEYS[2] .. ' holds ' .. string.format('%q', string.sub(cur, 1, 40)))
end
if not cur or tonumber(cur) < tonumber(v) then
  redis.call('HSET', KEYS[2], ARGV[2], v)
end
local last = '0-0'
if redis.call('EXISTS', KEYS[1]) == 1 then
  local info = redis.call('XINFO', 'STREAM', KEYS[1])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last = info[i + 1] end
  end
end
return {last, cur or false}
"#;

/// Reads, in one instant, what decides whether a group drained a parent up to its seal: the fence, the group's
/// last-delivered id, and whether any entry up to the seal is still pending.
///
/// KEYS: shard stream, shard fence. ARGV: group, seal id, fence field.
/// Answers `{fence (or false), last-delivered id (or false when the group or stream is missing), pending 0/1}`.
const DRAIN: &str = r#"
local fence = redis.call('HGET', KEYS[2], ARGV[3]) or false
if redis.call('EXISTS', KEYS[1]) == 0 then return {fence, false, 0} end
local last = false
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, delivered
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then delivered = g[i + 1] end
  end
  if name == ARGV[1] then last = delivered end
end
if not last then return {fence, false, 0} end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', ARGV[2], 1)
return {fence, last, #pending > 0 and 1 or 0}
"#;

/// The sources of the `SEAL` and `DRAIN` scripts. Not part of the API: for the Redis Cluster slot test (issue 15),
/// which runs them through a cluster connection.
#[doc(hidden)]
pub fn script_sources() -> [(&'static str, &'static str); 2] {
    [("SEAL", SEAL), ("DRAIN", DRAIN)]
}

static SEAL_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SEAL));
static DRAIN_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(DRAIN));

/// What the seal script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealed {
    /// The parent's last entry id when its fence was set.
    pub position: EntryId,
    /// The fence before the script (0 for none).
    pub fence_before: RoutingVersion,
}

/// Seals one parent for growth `version`: see [`SEAL`].
///
/// # Errors
/// [`StoreError::Redis`] when the script fails, [`StoreError::Corrupt`] for a fence or an answer that does not
/// parse.
pub async fn seal(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    stream: &StreamName,
    shard: ShardId,
    version: RoutingVersion,
) -> Result<Sealed, StoreError> {
    let reply: Vec<Value> = SEAL_SCRIPT
        .key(keys::shard_stream(stream, shard))
        .key(keys::shard_fence(stream, shard))
        .arg(version.0)
        .arg(shard_fence_fields::ROUTING_VERSION)
        .invoke_async(conn)
        .await?;
    let position = entry_id(reply.first())?.unwrap_or(EntryId::ZERO);
    let fence_before = fence(reply.get(1))?;
    Ok(Sealed { position, fence_before })
}

/// What [`drain_state`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainState {
    /// The parent's fence (0 for none).
    pub fence: RoutingVersion,
    /// The group's last-delivered id on the parent; `None` when the group or the stream does not exist.
    pub last_delivered: Option<EntryId>,
    /// Whether an entry at or below the seal is still pending for the group.
    pub pending_to_seal: bool,
}

impl DrainState {
    /// Whether the group has delivered and acknowledged every entry up to `seal`. An empty parent at its seal
    /// (`0-0`) is drained by every group.
    pub fn drained(&self, seal: EntryId) -> bool {
        seal == EntryId::ZERO || (self.last_delivered.is_some_and(|d| d >= seal) && !self.pending_to_seal)
    }
}

/// Reads the drain state of `group` on one parent against `seal`: see [`DRAIN`].
///
/// # Errors
/// As [`seal`].
pub async fn drain_state(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    stream: &StreamName,
    group: &GroupName,
    shard: ShardId,
    seal: EntryId,
) -> Result<DrainState, StoreError> {
    let reply: Vec<Value> = DRAIN_SCRIPT
        .key(keys::shard_stream(stream, shard))
        .key(keys::shard_fence(stream, shard))
        .arg(group.as_str())
        .arg(seal.to_string())
        .arg(shard_fence_fields::ROUTING_VERSION)
        .invoke_async(conn)
        .await?;
    let fence = fence(reply.first())?;
    let last_delivered = entry_id(reply.get(1))?;
    let pending_to_seal = matches!(reply.get(2), Some(Value::Int(1)));
    Ok(DrainState {
        fence,
        last_delivered,
        pending_to_seal,
    })
}

fn text(v: Option<&Value>) -> Result<Option<String>, StoreError> {
    match v {
        None | Some(Value::Nil) | Some(Value::Boolean(false)) => Ok(None),
        Some(Value::BulkString(b)) => Ok(Some(String::from_utf8_lossy(b).into_owned())),
        Some(Value::SimpleString(s)) => Ok(Some(s.clone())),
        Some(other) => Err(StoreError::Protocol(format!(
            "unexpected reshard script answer {other:?}"
        ))),
    }
}

fn entry_id(v: Option<&Value>) -> Result<Option<EntryId>, StoreError> {
    text(v)?
        .map(|s| s.parse::<EntryId>().map_err(|e| StoreError::Corrupt(e.to_string())))
        .transpose()
}

fn fence(v: Option<&Value>) -> Result<RoutingVersion, StoreError> {
    match text(v)? {
        None => Ok(RoutingVersion(0)),
        Some(s) => s
            .parse()
            .map(RoutingVersion)
            .map_err(|_| StoreError::Corrupt(format!("shard fence holds {s:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ms: u64, seq: u64) -> EntryId {
        EntryId { ms, seq }
    }

    #[test]
    fn drained_needs_delivery_past_the_seal_and_nothing_pending() {
        let s = DrainState {
            fence: RoutingVersion(2),
            last_delivered: Some(id(10, 0)),
            pending_to_seal: false,
        };
        assert!(s.drained(id(10, 0)));
        assert!(s.drained(id(9, 5)));
        assert!(!s.drained(id(10, 1)), "not delivered up to the seal");
        assert!(
            !DrainState {
                pending_to_seal: true,
                ..s
            }
            .drained(id(9, 0)),
            "delivered, not acknowledged"
        );
        let missing = DrainState {
            last_delivered: None,
            ..s
        };
        assert!(!missing.drained(id(1, 0)), "the group never read the parent");
        assert!(missing.drained(EntryId::ZERO), "an empty parent is drained by everyone");
    }

    #[test]
    fn answers_parse_strictly() {
        assert_eq!(fence(Some(&Value::Boolean(false))).unwrap(), RoutingVersion(0));
        assert_eq!(
            fence(Some(&Value::BulkString(b"7".to_vec()))).unwrap(),
            RoutingVersion(7)
        );
        assert!(fence(Some(&Value::BulkString(b"x".to_vec()))).is_err());
        assert!(entry_id(Some(&Value::BulkString(b"1-x".to_vec()))).is_err());
        assert_eq!(entry_id(Some(&Value::Nil)).unwrap(), None);
    }
}

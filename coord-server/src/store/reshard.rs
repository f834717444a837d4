//! The Redis side of resharding (see `docs/resharding.md`): the seal of a parent shard, the shards' own records,
//! and the observation of a group's drain of a parent. Each is one script (or read) on keys of the shard's own
//! hash slot (the shard stream and its record, the fence hash), so it is atomic with the producers' writes and
//! runs unchanged on a Cluster.

use protocol::keys::{self, shard_fence_fields};
use protocol::names::{GroupName, StreamName};
use protocol::reshard::{Birth, EntryId};
use protocol::{RoutingVersion, ShardId};
use redis::{Script, Value};
use std::sync::LazyLock;

use crate::error::StoreError;

/// Sets the fence to the growth's version (never lowers it) and records, in the shard's own record, where the
/// growth sealed it: the last entry id the stream generated at that instant (`0-0` for a missing stream). Nothing
/// can be written between the two: every entry after the position was written by a producer holding at least
/// that version. A seal of the same growth again answers the recorded position (the first one stays). With a
/// fourth argument (the seal field of a lost growth this one restores), that growth's recorded position is
/// taken when the shard has it: after it the fence already refused every producer of an older layout. Raising
/// the fence writes the shard count of the growth's layout beside it (`fenceCount`; a count of 0 removes it: not
/// known), so a producer presenting the version with another layout is refused too.
///
/// KEYS: shard stream, shard record (fence hash). ARGV: routing version, fence field, seal field of the version,
/// count field, count, [seal field to reuse].
/// Answers `{seal position, fence before (or false)}`.
const SEAL: &str = r#"
local v = ARGV[1]
local cur = redis.call('HGET', KEYS[2], ARGV[2])
if cur and not (#cur <= 16 and string.find(cur, '^%d+$')) then
  return redis.error_reply('CORRUPT fence ' .. KEYS[2] .. ' holds ' .. string.format('%q', string.sub(cur, 1, 40)))
end
if not cur or tonumber(cur) < tonumber(v) then
  redis.call('HSET', KEYS[2], ARGV[2], v)
  if ARGV[5] == '0' then
    redis.call('HDEL', KEYS[2], ARGV[4])
  else
    redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
  end
end
local pos = redis.call('HGET', KEYS[2], ARGV[3])
if not pos and ARGV[6] then pos = redis.call('HGET', KEYS[2], ARGV[6]) end
if not pos then
  pos = '0-0'
  if redis.call('EXISTS', KEYS[1]) == 1 then
    local info = redis.call('XINFO', 'STREAM', KEYS[1])
    for i = 1, #info, 2 do
      if info[i] == 'last-generated-id' then pos = info[i + 1] end
    end
  end
end
redis.call('HSET', KEYS[2], ARGV[3], pos)
return {pos, cur or false}
"#;

/// Writes a shard's birth into its record unless it has one (a record is never rewritten: the first birth is the
/// shard's), with the shard count of the layout that created it (`bornCount`, when known), and answers the
/// record's birth either way.
///
/// KEYS: shard record (fence hash). ARGV: born field, parents field, routing version, parents, count field, count.
/// Answers `{born, parents, count}`.
const RECORD: &str = r#"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3], ARGV[2], ARGV[4])
  if ARGV[6] ~= '0' then redis.call('HSET', KEYS[1], ARGV[5], ARGV[6]) end
end
return redis.call('HMGET', KEYS[1], ARGV[1], ARGV[2], ARGV[5])
"#;

/// Lowers the layout counts of a record that names a layout with more shards than the routing it is listed by,
/// at or below that routing's version (a seal or a birth of a layout Redis lost, left by a Cluster master that
/// lost the retirement's seal): without it, every producer of the routing would be refused there for good. The
/// fence itself is left as it is (it still refuses what it refused; no seal position is recorded).
///
/// KEYS: shard record. ARGV: routing version, shard count, fence field, fence count field, born field, born
/// count field. Answers 1 when it lowered a count, else 0.
const RECOUNT: &str = r#"
local v, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local changed = 0
local fence, fc = tonumber(r[1] or '0'), tonumber(r[2] or '0')
if fence and fc and fc > n and fence <= v then
  redis.call('HSET', KEYS[1], ARGV[4], ARGV[2])
  changed = 1
end
local born, bc = tonumber(r[3] or '0'), tonumber(r[4] or '0')
if born and bc and bc > n and born <= v then
  redis.call('HSET', KEYS[1], ARGV[6], ARGV[2])
  changed = 1
end
return changed
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
pub fn script_sources() -> [(&'static str, &'static str); 3] {
    [("SEAL", SEAL), ("DRAIN", DRAIN), ("RECORD", RECORD)]
}

static SEAL_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SEAL));
static DRAIN_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(DRAIN));
static RECORD_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RECORD));
static RECOUNT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RECOUNT));

/// What the seal script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealed {
    /// The parent's last entry id when its fence was set.
    pub position: EntryId,
    /// The fence before the script (0 for none).
    pub fence_before: RoutingVersion,
}

/// Seals one parent for growth `version`, whose layout has `count` shards: see [`SEAL`].
///
/// # Errors
/// [`StoreError::Redis`] when the script fails, [`StoreError::Corrupt`] for a fence or an answer that does not
/// parse.
pub async fn seal(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    stream: &StreamName,
    shard: ShardId,
    version: RoutingVersion,
    count: u32,
) -> Result<Sealed, StoreError> {
    seal_reusing(conn, stream, shard, version, count, None).await
}

/// Seals one parent for growth `version`, taking the position the lost growth `reuse` recorded when the parent
/// has it: see [`SEAL`].
///
/// # Errors
/// As [`seal`].
pub async fn seal_reusing(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    stream: &StreamName,
    shard: ShardId,
    version: RoutingVersion,
    count: u32,
    reuse: Option<RoutingVersion>,
) -> Result<Sealed, StoreError> {
    let mut call = SEAL_SCRIPT.key(keys::shard_stream(stream, shard));
    call.key(keys::shard_fence(stream, shard))
        .arg(version.0)
        .arg(shard_fence_fields::ROUTING_VERSION)
        .arg(shard_fence_fields::seal(version))
        .arg(shard_fence_fields::FENCE_COUNT)
        .arg(count);
    if let Some(lost) = reuse {
        call.arg(shard_fence_fields::seal(lost));
    }
    let reply: Vec<Value> = call.invoke_async(conn).await?;
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

/// Writes `birth` into its shard's record unless the record has one: see [`RECORD`]. Answers the record's birth.
///
/// # Errors
/// As [`seal`]; a record that does not parse is [`StoreError::Corrupt`].
pub async fn record(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    stream: &StreamName,
    birth: Birth,
) -> Result<Birth, StoreError> {
    let reply: Vec<Value> = RECORD_SCRIPT
        .key(keys::shard_fence(stream, birth.shard))
        .arg(shard_fence_fields::BORN_VERSION)
        .arg(shard_fence_fields::BORN_PARENTS)
        .arg(birth.born.0)
        .arg(birth.parents)
        .arg(shard_fence_fields::BORN_COUNT)
        .arg(birth.count)
        .invoke_async(conn)
        .await?;
    parse_birth(birth.shard, &reply)?.ok_or_else(|| StoreError::Protocol("the record script answered no birth".into()))
}

/// The birth one shard's record holds (`None`: no record).
///
/// # Errors
/// As [`record`].
pub async fn birth(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    stream: &StreamName,
    shard: ShardId,
) -> Result<Option<Birth>, StoreError> {
    let reply: Vec<Value> = redis::cmd("HMGET")
        .arg(keys::shard_fence(stream, shard))
        .arg(shard_fence_fields::BORN_VERSION)
        .arg(shard_fence_fields::BORN_PARENTS)
        .arg(shard_fence_fields::BORN_COUNT)
        .query_async(conn)
        .await?;
    parse_birth(shard, &reply)
}

/// Whether `shard`'s stream key holds entries (`XLEN > 0`). A key of another type holds none: it is no evidence of
/// writes, and one damaged key must not stop the probe of the others.
///
/// # Errors
/// A Redis failure other than a wrong type.
pub async fn holds_entries(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    stream: &StreamName,
    shard: ShardId,
) -> Result<bool, StoreError> {
    let reply: redis::RedisResult<u64> = redis::cmd("XLEN")
        .arg(keys::shard_stream(stream, shard))
        .query_async(conn)
        .await;
    match reply {
        Ok(n) => Ok(n > 0),
        Err(e) if e.code() == Some("WRONGTYPE") => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// One shard's record as the tick's sweep reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweptRecord {
    /// Its birth (`None`: no record).
    pub birth: Option<Birth>,
    /// Its fence (0 for none).
    pub fence: RoutingVersion,
    /// The shard count of the layout at the fence (0 for none).
    pub fence_count: u32,
}

impl SweptRecord {
    /// Whether the record names a layout with more shards than `routing` (`version`, `count`) at or below its
    /// version: see [`recount`].
    pub fn names_more_shards(&self, version: RoutingVersion, count: u32) -> bool {
        (self.fence_count > count && self.fence <= version)
            || self.birth.is_some_and(|b| b.count > count && b.born <= version)
    }
}

/// The records of `shards` for the tick's sweep, read concurrently (one `HMGET` each).
///
/// # Errors
/// As [`record`].
pub async fn swept<C>(conn: &C, stream: &StreamName, shards: &[ShardId]) -> Result<Vec<SweptRecord>, StoreError>
where
    C: redis::aio::ConnectionLike + Clone + Send + 'static,
{
    futures::future::try_join_all(shards.iter().map(|&shard| {
        let mut conn = conn.clone();
        let stream = stream.clone();
        async move {
            let reply: Vec<Value> = redis::cmd("HMGET")
                .arg(keys::shard_fence(&stream, shard))
                .arg(shard_fence_fields::BORN_VERSION)
                .arg(shard_fence_fields::BORN_PARENTS)
                .arg(shard_fence_fields::BORN_COUNT)
                .arg(shard_fence_fields::ROUTING_VERSION)
                .arg(shard_fence_fields::FENCE_COUNT)
                .query_async(&mut conn)
                .await?;
            Ok::<_, StoreError>(SweptRecord {
                birth: parse_birth(shard, &reply[..3.min(reply.len())])?,
                fence: fence(reply.get(3))?,
                fence_count: fence_count(shard, reply.get(4))?,
            })
        }
    }))
    .await
}

/// Lowers `shard`'s layout counts to `count` where its record names more shards at or below `version`: see
/// [`RECOUNT`]. Answers whether it changed anything.
///
/// # Errors
/// As [`seal`].
pub async fn recount(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    stream: &StreamName,
    shard: ShardId,
    version: RoutingVersion,
    count: u32,
) -> Result<bool, StoreError> {
    let changed: i64 = RECOUNT_SCRIPT
        .key(keys::shard_fence(stream, shard))
        .arg(version.0)
        .arg(count)
        .arg(shard_fence_fields::ROUTING_VERSION)
        .arg(shard_fence_fields::FENCE_COUNT)
        .arg(shard_fence_fields::BORN_VERSION)
        .arg(shard_fence_fields::BORN_COUNT)
        .invoke_async(conn)
        .await?;
    Ok(changed == 1)
}

/// A record's `fenceCount` (0 for none).
fn fence_count(shard: ShardId, v: Option<&Value>) -> Result<u32, StoreError> {
    match text(v)? {
        None => Ok(0),
        Some(c) => c
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("the record of shard {shard} holds fence count {c:?}"))),
    }
}

/// The fence one shard's record holds (0 for none) and the shard count of the layout at it (`fenceCount`, 0 for
/// none).
///
/// # Errors
/// As [`record`].
pub async fn fence_and_count(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    stream: &StreamName,
    shard: ShardId,
) -> Result<(RoutingVersion, u32), StoreError> {
    let reply: Vec<Value> = redis::cmd("HMGET")
        .arg(keys::shard_fence(stream, shard))
        .arg(shard_fence_fields::ROUTING_VERSION)
        .arg(shard_fence_fields::FENCE_COUNT)
        .query_async(conn)
        .await?;
    Ok((fence(reply.first())?, fence_count(shard, reply.get(1))?))
}

/// `{born, parents, count}` as `HMGET` answers them.
fn parse_birth(shard: ShardId, reply: &[Value]) -> Result<Option<Birth>, StoreError> {
    let (Some(born), parents, count) = (text(reply.first())?, text(reply.get(1))?, text(reply.get(2))?) else {
        return Ok(None);
    };
    let corrupt = || {
        StoreError::Corrupt(format!(
            "the record of shard {shard} holds born {born:?}, parents {parents:?}, count {count:?}"
        ))
    };
    let born: u64 = born.parse().map_err(|_| corrupt())?;
    let parents: u32 = parents.as_deref().unwrap_or("0").parse().map_err(|_| corrupt())?;
    let count: u32 = count.as_deref().unwrap_or("0").parse().map_err(|_| corrupt())?;
    // A layout that created shard `shard` has more shards than its index (0: written before counts were).
    if born == 0 || parents > shard.0 || (count != 0 && count <= shard.0) {
        return Err(corrupt());
    }
    Ok(Some(Birth {
        shard,
        born: RoutingVersion(born),
        parents,
        count,
    }))
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

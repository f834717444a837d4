//! The Redis store: one metadata hash per group (and one routing hash per stream), written only by a revision
//! compare-and-set under the group's mutex.
//!
//! A critical section costs two round trips:
//! 1. `LOAD` (one script): take the mutex (`SET NX PX`), read Redis `TIME`, the hash's `revision`,
//!    `livenessRevision`, `schemaVersion`, `layoutVersion` and `runId`, the server's current run id, the
//!    aggregate only when the revision differs from the one the caller has cached, and the liveness entries the
//!    input needs. A stored `runId` other than the server's means the metadata outlived a Redis restart or
//!    failover, which may have lost recent writes: the coordinator opens a correction round.
//! 2. `COMMIT` (one script): check both revisions, write the aggregate (bumping `revision`) and/or the liveness
//!    renewal (bumping `livenessRevision`, never `revision`, so a no-change heartbeat keeps the cached aggregate
//!    valid), then release the mutex if we still hold it. Or `RELEASE` alone when nothing changed.
//!
//! Why two revisions: a renewal must never slip between the load and the commit of a decision that read the
//! liveness (an expiry). Aggregate commits check both; renewals check only `revision`, so concurrent renewals of
//! different members never conflict. The mutex makes conflicts rare; the compare-and-set makes them harmless
//! when a stalled coordinator outlives its mutex.
//!
//! Every script touches keys of one hash tag only, so it runs on Redis Cluster.

use protocol::keys::{self, fields, LAYOUT_VERSION};
use protocol::metadata::{GroupMetadata, StreamRouting, GROUP_SCHEMA_VERSION, ROUTING_SCHEMA_VERSION};
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::StoreRevision;
use redis::aio::ConnectionManager;
use redis::{Script, Value};
use std::time::Duration;

use crate::error::StoreError;

const LOAD: &str = r#"
local ok = redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2])
if not ok then return {0} end
local t = redis.call('TIME')
local f = redis.call('HMGET', KEYS[1], 'revision', 'livenessRevision', 'schemaVersion', 'layoutVersion', 'runId')
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
local agg = ''
if f[1] and f[1] ~= ARGV[3] then agg = redis.call('HGET', KEYS[1], 'aggregate') or '' end
local live = {}
if ARGV[4] == '*' then
  live = redis.call('HGETALL', KEYS[2])
elseif ARGV[4] == 'm' and #ARGV > 4 then
  local members = {unpack(ARGV, 5)}
  local values = redis.call('HMGET', KEYS[2], unpack(members))
  for i, m in ipairs(members) do
    if values[i] then live[#live + 1] = m; live[#live + 1] = values[i] end
  end
end
return {1, t[1], t[2], f[1] or '', f[2] or '0', f[3] or '', f[4] or '', agg, live, f[5] or '', run,
  redis.call('EXISTS', KEYS[2])}
"#;

const COMMIT: &str = r#"
local f = redis.call('HMGET', KEYS[1], 'revision', 'livenessRevision')
local rev = f[1] or ''
local live = f[2] or '0'
local function release()
  if redis.call('GET', KEYS[3]) == ARGV[1] then redis.call('DEL', KEYS[3]) end
end
if rev ~= ARGV[2] or (ARGV[4] ~= '' and live ~= ARGV[3]) then
  release()
  return {0, rev}
end
local newrev = rev
if ARGV[4] ~= '' then
  newrev = tostring((tonumber(rev) or 0) + 1)
  redis.call('HSET', KEYS[1], 'aggregate', ARGV[4], 'revision', newrev, 'schemaVersion', ARGV[5],
    'layoutVersion', ARGV[6], 'updatedAt', ARGV[7], 'runId', ARGV[8])
end
local renewals = tonumber(ARGV[9])
for i = 0, renewals - 1 do
  local m, lease = ARGV[10 + 2 * i], ARGV[11 + 2 * i]
  local cur = tonumber(redis.call('HGET', KEYS[2], m) or '0')
  if tonumber(lease) > cur then redis.call('HSET', KEYS[2], m, lease) end
end
if renewals > 0 then redis.call('HINCRBY', KEYS[1], 'livenessRevision', 1) end
for i = 10 + 2 * renewals, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
release()
return {1, newrev}
"#;

const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#;

/// The keys of one critical section: a hash, its liveness hash and its mutex (one hash tag).
#[derive(Debug, Clone)]
pub struct SectionKeys {
    /// The metadata (or routing) hash.
    pub hash: String,
    /// The liveness hash (for routing: unused, the routing hash itself).
    pub liveness: String,
    /// The mutex.
    pub mutex: String,
}

impl SectionKeys {
    /// Keys of a group.
    pub fn group(stream: &StreamName, group: &GroupName) -> Self {
        SectionKeys {
            hash: keys::group_metadata(stream, group),
            liveness: keys::group_liveness(stream, group),
            mutex: keys::group_mutex(stream, group),
        }
    }

    /// Keys of a stream's routing.
    pub fn routing(stream: &StreamName) -> Self {
        let hash = keys::stream_routing(stream);
        SectionKeys {
            liveness: hash.clone(),
            hash,
            mutex: keys::stream_routing_mutex(stream),
        }
    }
}

/// Which liveness entries to load.
#[derive(Debug, Clone, Copy)]
pub enum LivenessScope<'a> {
    /// None.
    None,
    /// One member's.
    Member(&'a MemberId),
    /// These members' (a batch of heartbeats).
    Members(&'a [&'a MemberId]),
    /// All of them (ticks).
    All,
}

/// What `LOAD` read while taking the mutex.
#[derive(Debug)]
pub struct Loaded {
    /// Redis `TIME` in ms.
    pub now_ms: u64,
    /// The hash's revision; `None` when the hash does not exist.
    pub revision: Option<StoreRevision>,
    /// The liveness revision.
    pub liveness_revision: u64,
    /// `schemaVersion` field.
    pub schema_version: Option<u32>,
    /// `layoutVersion` field.
    pub layout_version: Option<u32>,
    /// The aggregate JSON, unless the revision equals the cached one (or the hash is missing).
    pub aggregate: Option<Vec<u8>>,
    /// Liveness entries read: member -> lease end ms (unparsable entries are skipped).
    pub liveness: Vec<(MemberId, u64)>,
    /// Redis run id the aggregate was last written under (empty when unknown).
    pub stored_run_id: String,
    /// The server's run id now.
    pub run_id: String,
    /// Whether the liveness hash is absent (a group with members always has one: it was deleted or evicted).
    pub liveness_missing: bool,
}

impl Loaded {
    /// Whether the stored metadata was written by another Redis server incarnation (restart or failover).
    pub fn run_id_changed(&self) -> bool {
        !self.stored_run_id.is_empty() && !self.run_id.is_empty() && self.stored_run_id != self.run_id
    }
}

/// What to write in `COMMIT`.
#[derive(Debug, Default)]
pub struct Write<'a> {
    /// New aggregate JSON (bumps `revision`).
    pub aggregate: Option<&'a str>,
    /// Schema version of that aggregate.
    pub schema_version: u32,
    /// Liveness renewals (member, lease end ms); a lease never moves backwards.
    pub renew: &'a [(MemberId, u64)],
    /// Liveness entries to delete.
    pub forget: &'a [MemberId],
    /// Redis time of the write (the `updatedAt` field).
    pub now_ms: u64,
    /// The server's run id, recorded with the aggregate.
    pub run_id: &'a str,
}

/// Result of `COMMIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// Written; the hash's revision now.
    Ok(StoreRevision),
    /// Another writer got there first: reload and decide again.
    Conflict,
}

/// Redis access of the coordinator.
#[derive(Clone)]
pub struct Store {
    conn: ConnectionManager,
    load: Script,
    commit: Script,
    release: Script,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

impl Store {
    /// Wraps a connection manager.
    pub fn new(conn: ConnectionManager) -> Self {
        Store {
            conn,
            load: Script::new(LOAD),
            commit: Script::new(COMMIT),
            release: Script::new(RELEASE),
        }
    }

    /// A clone of the underlying connection, for plain commands.
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// Tries once to take the mutex and load. `Ok(None)`: the mutex is busy.
    ///
    /// # Errors
    /// Redis errors and malformed replies.
    pub async fn try_load(
        &self,
        keys: &SectionKeys,
        token: &str,
        mutex_ttl: Duration,
        cached: Option<StoreRevision>,
        scope: LivenessScope<'_>,
    ) -> Result<Option<Loaded>, StoreError> {
        let (scope_arg, members): (&str, Vec<&MemberId>) = match scope {
            LivenessScope::None => ("", Vec::new()),
            LivenessScope::Member(m) => ("m", vec![m]),
            LivenessScope::Members(ms) => ("m", ms.to_vec()),
            LivenessScope::All => ("*", Vec::new()),
        };
        let mut conn = self.conn.clone();
        let mut inv = self.load.key(&keys.hash);
        inv.key(&keys.liveness)
            .key(&keys.mutex)
            .arg(token)
            .arg(mutex_ttl.as_millis() as u64)
            .arg(cached.map(|r| r.0.to_string()).unwrap_or_default())
            .arg(scope_arg);
        for m in members {
            inv.arg(m.as_str());
        }
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        if int(&reply, 0)? == 0 {
            return Ok(None);
        }
        let secs = text(&reply, 1)?.parse::<u64>().map_err(bad)?;
        let micros = text(&reply, 2)?.parse::<u64>().map_err(bad)?;
        let revision = opt_num(&text(&reply, 3)?)?.map(StoreRevision);
        let liveness_revision = opt_num(&text(&reply, 4)?)?.unwrap_or(0);
        let schema_version = opt_num(&text(&reply, 5)?)?.map(|v| v as u32);
        let layout_version = opt_num(&text(&reply, 6)?)?.map(|v| v as u32);
        let aggregate = match reply.get(7) {
            Some(Value::BulkString(b)) if !b.is_empty() => Some(b.clone()),
            _ => None,
        };
        let mut liveness = Vec::new();
        if let Some(Value::Array(items)) = reply.get(8) {
            for pair in items.chunks(2) {
                if let [Value::BulkString(k), Value::BulkString(v)] = pair {
                    let member = std::str::from_utf8(k).ok().and_then(|k| MemberId::new(k).ok());
                    let lease = std::str::from_utf8(v).ok().and_then(|v| v.parse::<u64>().ok());
                    if let (Some(m), Some(l)) = (member, lease) {
                        liveness.push((m, l));
                    }
                }
            }
        }
        Ok(Some(Loaded {
            now_ms: secs * 1000 + micros / 1000,
            revision,
            liveness_revision,
            schema_version,
            layout_version,
            aggregate,
            liveness,
            stored_run_id: text(&reply, 9)?,
            run_id: text(&reply, 10)?,
            liveness_missing: int(&reply, 11)? == 0,
        }))
    }

    /// Compare-and-set write, then releases the mutex (also on conflict).
    ///
    /// # Errors
    /// Redis errors and malformed replies.
    pub async fn commit(
        &self,
        keys: &SectionKeys,
        token: &str,
        expected: Option<StoreRevision>,
        expected_liveness: u64,
        write: &Write<'_>,
    ) -> Result<Committed, StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = self.commit.key(&keys.hash);
        inv.key(&keys.liveness)
            .key(&keys.mutex)
            .arg(token)
            .arg(expected.map(|r| r.0.to_string()).unwrap_or_default())
            .arg(expected_liveness.to_string())
            .arg(write.aggregate.unwrap_or(""))
            .arg(write.schema_version)
            .arg(LAYOUT_VERSION)
            .arg(write.now_ms)
            .arg(write.run_id)
            .arg(write.renew.len());
        for (m, lease) in write.renew {
            inv.arg(m.as_str()).arg(*lease);
        }
        for m in write.forget {
            inv.arg(m.as_str());
        }
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        if int(&reply, 0)? == 1 {
            let rev = opt_num(&text(&reply, 1)?)?.unwrap_or(0);
            Ok(Committed::Ok(StoreRevision(rev)))
        } else {
            Ok(Committed::Conflict)
        }
    }

    /// Releases the mutex if `token` still holds it.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn release(&self, keys: &SectionKeys, token: &str) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: i64 = self.release.key(&keys.mutex).arg(token).invoke_async(&mut conn).await?;
        Ok(())
    }

    /// Reads a stream's routing without the mutex (routing reads are snapshots; writes go through the CAS).
    ///
    /// # Errors
    /// Redis errors; [`StoreError::Protocol`] never: a bad document (or an unknown schema or layout version) is
    /// reported by the caller's [`decode_routing`].
    pub async fn read_routing(&self, stream: &StreamName) -> Result<Option<(StoreRevision, RoutingDoc)>, StoreError> {
        let mut conn = self.conn.clone();
        type Fields = (Option<u64>, Option<Vec<u8>>, Option<u32>, Option<u32>);
        let (rev, agg, schema_version, layout_version): Fields = redis::cmd("HMGET")
            .arg(keys::stream_routing(stream))
            .arg(fields::REVISION)
            .arg(fields::AGGREGATE)
            .arg(fields::SCHEMA_VERSION)
            .arg(fields::LAYOUT_VERSION)
            .query_async(&mut conn)
            .await?;
        Ok(match (rev, agg) {
            (Some(rev), Some(aggregate)) => Some((
                StoreRevision(rev),
                RoutingDoc {
                    aggregate,
                    schema_version,
                    layout_version,
                },
            )),
            _ => None,
        })
    }

    /// Adds a group to the rebuildable groups index (and its stream to the streams index).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn index_group(&self, stream: &StreamName, group: &GroupName) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        redis::pipe()
            .sadd(keys::groups_index(), keys::groups_index_member(stream, group))
            .ignore()
            .sadd(keys::streams_index(), stream.as_str())
            .ignore()
            .query_async::<()>(&mut conn)
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

    /// Rebuilds the groups index by scanning metadata keys. Returns the `stream:group` pairs found.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn rebuild_index(&self) -> Result<Vec<String>, StoreError> {
        let mut conn = self.conn.clone();
        let mut cursor: u64 = 0;
        let mut found = Vec::new();
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(keys::group_metadata_pattern())
                .arg("COUNT")
                .arg(500)
                .query_async(&mut conn)
                .await?;
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
        found.sort();
        found.dedup();
        if !found.is_empty() {
            let _: () = redis::cmd("SADD")
                .arg(keys::groups_index())
                .arg(&found)
                .query_async(&mut conn)
                .await?;
        }
        Ok(found)
    }

    /// Redis `run_id` (changes when the server restarts).
    ///
    /// # Errors
    /// Redis errors, or a reply without `run_id`.
    pub async fn run_id(&self) -> Result<String, StoreError> {
        let mut conn = self.conn.clone();
        let info: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await?;
        info.lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|s| s.trim().to_owned())
            .ok_or_else(|| StoreError::Protocol("INFO server has no run_id".into()))
    }
}

/// Schema versions this build writes, for callers building a [`Write`].
pub const fn schema_of_group() -> u32 {
    GROUP_SCHEMA_VERSION
}

/// Schema version of routing documents.
pub const fn schema_of_routing() -> u32 {
    ROUTING_SCHEMA_VERSION
}

/// Decodes a group aggregate, checking the hash's `schemaVersion` and `layoutVersion` fields too.
///
/// # Errors
/// A sentence for the `METADATA_UNAVAILABLE` answer.
pub fn decode_group(loaded: &Loaded, json: &[u8]) -> Result<GroupMetadata, String> {
    check_versions(loaded, GROUP_SCHEMA_VERSION)?;
    GroupMetadata::decode(json).map_err(|e| format!("group metadata is unreadable: {e}"))
}

/// A routing hash as read outside a critical section: the document and the hash's version fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingDoc {
    /// The `aggregate` JSON.
    pub aggregate: Vec<u8>,
    /// `schemaVersion` field.
    pub schema_version: Option<u32>,
    /// `layoutVersion` field.
    pub layout_version: Option<u32>,
}

/// Decodes a routing hash, checking its `schemaVersion` and `layoutVersion` fields first: a routing this build
/// cannot interpret is refused (fail closed), never guessed at.
///
/// # Errors
/// A sentence for the `METADATA_UNAVAILABLE` answer.
pub fn decode_routing(doc: &RoutingDoc) -> Result<StreamRouting, String> {
    check_version_fields(doc.schema_version, doc.layout_version, ROUTING_SCHEMA_VERSION)?;
    decode_routing_json(&doc.aggregate)
}

/// Decodes a routing document whose hash fields were checked already ([`check_versions`]).
///
/// # Errors
/// A sentence for the `METADATA_UNAVAILABLE` answer.
pub fn decode_routing_json(json: &[u8]) -> Result<StreamRouting, String> {
    StreamRouting::decode(json).map_err(|e| format!("stream routing is unreadable: {e}"))
}

/// Checks the hash's `schemaVersion` and `layoutVersion` fields.
///
/// # Errors
/// A sentence naming the unknown version.
pub fn check_versions(loaded: &Loaded, schema: u32) -> Result<(), String> {
    check_version_fields(loaded.schema_version, loaded.layout_version, schema)
}

fn check_version_fields(schema_version: Option<u32>, layout_version: Option<u32>, schema: u32) -> Result<(), String> {
    if layout_version != Some(LAYOUT_VERSION) {
        return Err(format!(
            "unknown layoutVersion {layout_version:?} (this build understands {LAYOUT_VERSION})"
        ));
    }
    if schema_version != Some(schema) {
        return Err(format!(
            "unknown schemaVersion {schema_version:?} (this build understands {schema})"
        ));
    }
    Ok(())
}

fn bad<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Protocol(e.to_string())
}

fn int(reply: &[Value], i: usize) -> Result<i64, StoreError> {
    match reply.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(StoreError::Protocol(format!(
            "expected an integer at {i}, got {other:?}"
        ))),
    }
}

fn text(reply: &[Value], i: usize) -> Result<String, StoreError> {
    match reply.get(i) {
        Some(Value::BulkString(b)) => String::from_utf8(b.clone()).map_err(bad),
        Some(Value::SimpleString(s)) => Ok(s.clone()),
        Some(Value::Int(n)) => Ok(n.to_string()),
        Some(Value::Nil) | None => Ok(String::new()),
        other => Err(StoreError::Protocol(format!("expected text at {i}, got {other:?}"))),
    }
}

fn opt_num(s: &str) -> Result<Option<u64>, StoreError> {
    if s.is_empty() {
        Ok(None)
    } else {
        s.parse::<u64>().map(Some).map_err(bad)
    }
}

//! The Redis store: one metadata hash per group (and one routing hash per stream), written only by a revision
//! compare-and-set under the group's mutex.
//!
//! A critical section costs two round trips:
//! 1. `LOAD` (one script): take the mutex (free when missing or empty; `SET PX`), read Redis `TIME`, the hash's `revision`,
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
//!
//! A released mutex of an existing hash is left as an empty string, not deleted: while a slot migrates, Redis refuses (`TRYAGAIN`)
//! every multi-key command of the slot that names a key missing on the node, and the scripts name the mutex.
//! With the mutex (and, for a group with members, the liveness hash) always present, a group's sections keep
//! running on the source node until its keys move, and on the target right after (`ASK`); only while the slot's
//! few keys are split between two `MIGRATE` batches are they refused. A mutex that expired (its holder died) is
//! missing again until the next section.
//!
//! On a cluster, redis-rs's connection follows `MOVED` / `ASK` and retries `TRYAGAIN`; it also sends a command
//! again after a lost connection, so a script may run twice. Each one stays right when it does:
//! - `LOAD` run again finds the mutex holding its own token (unique per attempt) and goes on as if it had just
//!   taken it; it writes nothing else.
//! - `COMMIT` run again after an aggregate write finds the revision it bumped, not the expected one: the
//!   compare-and-set fails (`Conflict`), nothing is written twice, and the caller reloads and finds its own write.
//!   A renewal-only `COMMIT` run again writes leases that never move backwards (no change) and bumps
//!   `livenessRevision` once more, which can only make a concurrent decision that read the liveness conflict and
//!   retry. Its release frees the mutex only while it holds this token.
//! - A redirected command (`MOVED`, `ASK`) did not run where it was refused, and the keys of one slot move
//!   together (`MIGRATE` keeps the mutex's TTL), so a section that started on the old node commits on the new one
//!   under the same mutex and revision.
//! - A failover may lose the last writes, the mutex included: two sections may then overlap, and the revision
//!   compare-and-set decides between them, as after a stalled holder's TTL. The lost writes themselves are found
//!   by the stored run id (see [`Store::try_load`]).

use protocol::keys::{self, fields, LAYOUT_VERSION};
use protocol::messages::GroupRef;
use protocol::metadata::{GroupMetadata, StreamRouting, GROUP_SCHEMA_VERSION, ROUTING_SCHEMA_VERSION};
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::StoreRevision;
use redis::aio::ConnectionManager;
use redis::{Script, Value};
use redis_link::{Connection, RedisTarget};
use std::collections::HashSet;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tracing::warn;

use crate::error::StoreError;

/// Connect timeout of each cluster node connection.
const CLUSTER_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Answer timeout on a cluster (the single-server connection manager keeps redis-rs's default).
const CLUSTER_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the cluster connection retries a command after `TRYAGAIN`, `CLUSTERDOWN`, a redirect or a lost
/// node. redis-rs's default (16 retries, each after at least 1.28 s) would hold a section far past its mutex TTL
/// and the members' leases; these retries end within about half a second (waits between
/// [`CLUSTER_MIN_RETRY_WAIT_MS`] and [`CLUSTER_MAX_RETRY_WAIT_MS`], doubling from 10 ms), after which the request
/// answers a retryable `STORE_UNAVAILABLE` and the member retries.
const CLUSTER_RETRIES: u32 = 6;
/// Shortest wait before a cluster retry, in ms.
const CLUSTER_MIN_RETRY_WAIT_MS: u64 = 5;
/// Longest wait before a cluster retry, in ms.
const CLUSTER_MAX_RETRY_WAIT_MS: u64 = 200;

pub mod lag;
pub mod nodes;
pub mod traces;

/// Lua helpers shared by `LOAD` and `COMMIT`: the strict parsing of every stored field. A field is a canonical
/// decimal (no sign, no leading zero, no spaces) short enough to be exact as a Lua number and as a Redis integer;
/// anything else is corrupt. The checks run before the script writes anything (Redis does not roll back a script
/// that fails half way), so a corrupt hash is answered `METADATA_UNAVAILABLE` and left exactly as it was.
const FIELD_CHECKS: &str = r#"
local function canonical(v, digits)
  return #v <= digits and (v == '0' or string.find(v, '^[1-9]%d*$') ~= nil)
end
local function quote(v) return string.format('%q', string.sub(v, 1, 40)) end
local function check_hash(f, schema, layout)
  if f[1] and not canonical(f[1], 18) then return 'revision is ' .. quote(f[1]) end
  if f[2] and not canonical(f[2], 18) then return 'livenessRevision is ' .. quote(f[2]) end
  if f[3] and not canonical(f[3], 9) then return 'schemaVersion is ' .. quote(f[3]) end
  if f[4] and not canonical(f[4], 9) then return 'layoutVersion is ' .. quote(f[4]) end
  if f[5] and not (#f[5] == 40 and string.find(f[5], '^%x+$')) then return 'runId is ' .. quote(f[5]) end
  if f[6] and not canonical(f[6], 15) then return 'updatedAt is ' .. quote(f[6]) end
  if f[1] then
    if f[4] ~= layout then
      return 'unknown layoutVersion ' .. quote(f[4] or 'missing') .. ' (this build understands ' .. layout .. ')'
    end
    if f[3] ~= schema then
      return 'unknown schemaVersion ' .. quote(f[3] or 'missing') .. ' (this build understands ' .. schema .. ')'
    end
  end
  return nil
end
local function check_lease(m, v)
  if v and not canonical(v, 15) then return 'liveness of ' .. quote(m) .. ' is ' .. quote(v) end
  return nil
end
local FIELDS = {'revision', 'livenessRevision', 'schemaVersion', 'layoutVersion', 'runId', 'updatedAt'}
"#;

/// Validates, then takes the mutex (`SET NX PX`) and reads. A corrupt hash answers `{2, why}` without taking the
/// mutex; a busy mutex answers `{0, holder}` so the caller can recognise a stale mutex of its own.
///
/// ARGV: token, ttl ms, cached revision, cached aggregate check (`len:<bytes>` or `sha1:<hex>`), schema, layout,
/// liveness scope, members...
const LOAD: &str = r#"
local f = redis.call('HMGET', KEYS[1], unpack(FIELDS))
local bad = check_hash(f, ARGV[5], ARGV[6])
if bad then return {2, bad} end
local live = {}
if ARGV[7] == '*' then
  live = redis.call('HGETALL', KEYS[2])
  for i = 1, #live, 2 do
    bad = check_lease(live[i], live[i + 1])
    if bad then return {2, bad} end
  end
elseif ARGV[7] == 'm' and #ARGV > 7 then
  local members = {unpack(ARGV, 8)}
  local values = redis.call('HMGET', KEYS[2], unpack(members))
  for i, m in ipairs(members) do
    bad = check_lease(m, values[i])
    if bad then return {2, bad} end
    if values[i] then live[#live + 1] = m; live[#live + 1] = values[i] end
  end
end
-- Free: missing or empty (released). Our own token: this LOAD was sent again after it ran (a cluster client
-- re-sends after a lost connection); tokens are unique per attempt, so the mutex is ours: go on as if just taken.
local holder = redis.call('GET', KEYS[3])
if holder and holder ~= '' and holder ~= ARGV[1] then return {0, holder} end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
local t = redis.call('TIME')
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
-- The cache may skip sending and parsing the aggregate, never checking it: at the cached revision, the stored
-- aggregate must still have the cached length (O(1): a deleted or replaced aggregate), or, when asked (ticks),
-- the cached SHA-1 (any edit, at the price of hashing it).
local agg, hit = '', 0
if f[1] then
  local same = false
  if f[1] == ARGV[3] then
    local kind, want = string.match(ARGV[4], '^(%a+):(%w+)$')
    if kind == 'len' then
      same = redis.call('HSTRLEN', KEYS[1], 'aggregate') == tonumber(want)
    elseif kind == 'sha1' then
      local a = redis.call('HGET', KEYS[1], 'aggregate')
      same = a and redis.sha1hex(a) == want
    end
  end
  if same then hit = 1 else agg = redis.call('HGET', KEYS[1], 'aggregate') or '' end
end
return {1, t[1], t[2], f[1] or '', f[2] or '0', f[3] or '', f[4] or '', agg, live, f[5] or '', run,
  redis.call('EXISTS', KEYS[2]), hit}
"#;

/// Validates everything it reads or overwrites, then writes; a corrupt hash answers `{2, why}` with nothing
/// written and the mutex released.
///
/// ARGV: token, expected revision, expected liveness revision, aggregate, schema, layout, updatedAt, runId,
/// SHA-1 of the aggregate the decision read, renewal count, (member, lease)..., forgotten members...
const COMMIT: &str = r#"
local function release()
  if redis.call('GET', KEYS[3]) ~= ARGV[1] then return end
  if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('SET', KEYS[3], '') else redis.call('DEL', KEYS[3]) end
end
local function corrupt(why)
  release()
  return {2, why}
end
local f = redis.call('HMGET', KEYS[1], unpack(FIELDS))
local bad = check_hash(f, ARGV[5], ARGV[6])
if bad then return corrupt(bad) end
local rev = f[1] or ''
local live = f[2] or '0'
if rev ~= ARGV[2] or (ARGV[4] ~= '' and live ~= ARGV[3]) then
  release()
  return {0, rev}
end
-- A decision is written only to the server it was loaded from: after a failover between the load and here, what
-- the section wrote elsewhere before its commit (a growth's seals and records) may be lost while the revision
-- still matches. A conflict: the section loads again and sees the new run id.
if ARGV[4] ~= '' and ARGV[8] ~= '' and (string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or '') ~= ARGV[8] then
  release()
  return {0, rev}
end
if rev == '' and redis.call('EXISTS', KEYS[1]) == 1 then
  return corrupt('the hash exists without a revision')
end
if ARGV[4] ~= '' and rev ~= '' then
  -- Never overwrite an aggregate other than the one the decision read (a same-length edit passes LOAD's check).
  local stored = redis.call('HGET', KEYS[1], 'aggregate')
  if not stored or redis.sha1hex(stored) ~= ARGV[9] then
    return corrupt('the aggregate is not the one this decision read')
  end
end
local renewals = tonumber(ARGV[10])
local current = {}
for i = 0, renewals - 1 do
  local m = ARGV[11 + 2 * i]
  local v = redis.call('HGET', KEYS[2], m)
  bad = check_lease(m, v)
  if bad then return corrupt(bad) end
  current[i] = tonumber(v or '0')
end
local newrev = rev
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'aggregate', ARGV[4], 'schemaVersion', ARGV[5], 'layoutVersion', ARGV[6],
    'updatedAt', ARGV[7], 'runId', ARGV[8])
  newrev = redis.call('HINCRBY', KEYS[1], 'revision', 1)
end
for i = 0, renewals - 1 do
  local m, lease = ARGV[11 + 2 * i], ARGV[12 + 2 * i]
  if tonumber(lease) > current[i] then redis.call('HSET', KEYS[2], m, lease) end
end
if renewals > 0 then redis.call('HINCRBY', KEYS[1], 'livenessRevision', 1) end
for i = 11 + 2 * renewals, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
release()
return {1, newrev}
"#;

/// After a slot migration: the metadata was last written on the node the slot left (its run id is stored) and is
/// read now on the node it moved to. Once the caller has checked that the stored run id is the one of a live
/// master (so no failover or restart replaced that node), this records the run id of the node the script runs
/// on, provided it is still the one `LOAD` saw and the stored one is unchanged. Run under the group's mutex.
///
/// ARGV: stored run id, current run id. Answers 1 when it wrote.
const ADOPT_RUN_ID: &str = r#"
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
if run ~= ARGV[2] or redis.call('HGET', KEYS[1], 'runId') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'runId', run)
return 1
"#;

/// Frees the mutex if `ARGV[1]` holds it: sets it empty (no TTL) while the hash (`KEYS[2]`) exists, rather than
/// deleting it (see the module docs); deletes it when there is no hash, so a request naming a group that does not
/// exist leaves no key behind.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('SET', KEYS[1], '') else redis.call('DEL', KEYS[1]) end
  return 1
end
return 0
"#;

/// The sources of the store's scripts as [`Store`] runs them: `LOAD` and `COMMIT` (each after the shared field
/// checks), then `RELEASE`. Not part of the API: for the Redis Cluster slot test (issue 15), which runs them
/// through a cluster connection.
#[doc(hidden)]
pub fn script_sources() -> [(&'static str, String); 3] {
    [
        ("LOAD", format!("{FIELD_CHECKS}{LOAD}")),
        ("COMMIT", format!("{FIELD_CHECKS}{COMMIT}")),
        ("RELEASE", RELEASE.to_owned()),
    ]
}

/// The keys of one critical section: a hash, its liveness hash and its mutex (one hash tag), and the schema
/// version of the hash's document.
#[derive(Debug, Clone)]
pub struct SectionKeys {
    /// The metadata (or routing) hash.
    pub hash: String,
    /// The liveness hash (for routing: unused, the routing hash itself).
    pub liveness: String,
    /// The mutex.
    pub mutex: String,
    /// The `schemaVersion` this build reads and writes in `hash`.
    pub schema: u32,
}

impl SectionKeys {
    /// Keys of a group.
    pub fn group(stream: &StreamName, group: &GroupName) -> Self {
        SectionKeys {
            hash: keys::group_metadata(stream, group),
            liveness: keys::group_liveness(stream, group),
            mutex: keys::group_mutex(stream, group),
            schema: GROUP_SCHEMA_VERSION,
        }
    }

    /// Keys of a stream's routing.
    pub fn routing(stream: &StreamName) -> Self {
        let hash = keys::stream_routing(stream);
        SectionKeys {
            liveness: hash.clone(),
            hash,
            mutex: keys::stream_routing_mutex(stream),
            schema: ROUTING_SCHEMA_VERSION,
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

/// The aggregate a caller has parsed already: `LOAD` skips sending it while the stored revision is the same and
/// the stored aggregate has the same length (every load) and the same digest (loads of all liveness, i.e. ticks
/// and fences, which hash it).
#[derive(Debug, Clone, Copy)]
pub struct Cached<'a> {
    /// The revision it was read or written at.
    pub revision: StoreRevision,
    /// [`digest`] of its JSON.
    pub digest: &'a str,
    /// Length of its JSON in bytes.
    pub len: usize,
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
    /// The aggregate JSON, unless the caller's cached one is still current (or the hash is missing).
    pub aggregate: Option<Vec<u8>>,
    /// [`digest`] of the aggregate this load stands for (the one sent, or the cached one on a hit); empty when
    /// there is none.
    pub aggregate_digest: String,
    /// Whether the caller's [`Cached`] aggregate is the stored one (same revision, same bytes).
    pub cache_hit: bool,
    /// Liveness entries read: member -> lease end ms.
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
    /// New aggregate JSON (bumps `revision`), written with the section's [`SectionKeys::schema`].
    pub aggregate: Option<&'a str>,
    /// [`Loaded::aggregate_digest`] of the load the decision read: an aggregate is only written over that one.
    pub replaces: &'a str,
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

/// A mutex token of this store, registered as live until dropped.
///
/// Every token starts with its store's owner id: a mutex that carries this store's id but no live token is a
/// leftover of this process (a section that failed or was cancelled before its release, or a mutex Redis brought
/// back from its append-only file after a restart), which nobody can be using, so it is deleted instead of
/// waited out. Mutexes of other owners are only ever waited for: they may belong to a live section.
#[derive(Debug)]
pub struct Token {
    value: String,
    live: Arc<StdMutex<HashSet<String>>>,
}

impl std::ops::Deref for Token {
    type Target = str;

    fn deref(&self) -> &str {
        &self.value
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        if let Ok(mut live) = self.live.lock() {
            live.remove(&self.value);
        }
    }
}

/// Redis access of the coordinator.
#[derive(Clone)]
pub struct Store {
    conn: Connection,
    /// The cluster's nodes (for what every master must answer), `None` on one server.
    nodes: Option<Arc<redis_link::ClusterRouter>>,
    load: Script,
    commit: Script,
    release: Script,
    adopt_run_id: Script,
    /// Prefix of this store's mutex tokens (random per process).
    owner: Arc<str>,
    /// Tokens of the sections running now.
    live: Arc<StdMutex<HashSet<String>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Wraps a connection to one server.
    pub fn new(conn: ConnectionManager) -> Self {
        Self::with_connection(Connection::Single(conn), None)
    }

    fn with_connection(conn: Connection, nodes: Option<Arc<redis_link::ClusterRouter>>) -> Self {
        Store {
            conn,
            nodes,
            load: Script::new(&format!("{FIELD_CHECKS}{LOAD}")),
            commit: Script::new(&format!("{FIELD_CHECKS}{COMMIT}")),
            release: Script::new(RELEASE),
            adopt_run_id: Script::new(ADOPT_RUN_ID),
            owner: format!("{:016x}", rand::random::<u64>()).into(),
            live: Arc::default(),
        }
    }

    /// Connects to the Redis that `url` names: one server's URL, or `cluster:` and seed URLs (see
    /// [`RedisTarget`]). The connection reconnects by itself afterwards; on a cluster it follows `MOVED`, `ASK`
    /// and failovers (a retried write is harmless: every write is a revision compare-and-set or idempotent).
    ///
    /// # Errors
    /// A malformed URL; Redis unreachable.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let target = RedisTarget::parse(url).map_err(|e| {
            StoreError::Redis(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "invalid Redis target",
                e.to_string(),
            )))
        })?;
        match target {
            RedisTarget::Single(url) => {
                let client = redis::Client::open(url)?;
                Ok(Store::new(ConnectionManager::new(client).await?))
            }
            RedisTarget::Cluster(seeds) => {
                let client = redis::cluster::ClusterClientBuilder::new(seeds.clone())
                    .connection_timeout(CLUSTER_CONNECT_TIMEOUT)
                    .response_timeout(CLUSTER_RESPONSE_TIMEOUT)
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(CLUSTER_MIN_RETRY_WAIT_MS)
                    .max_retry_wait(CLUSTER_MAX_RETRY_WAIT_MS)
                    .retry_wait_formula(10, 2)
                    .build()?;
                let conn = Connection::Cluster(client.get_async_connection().await?);
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CLUSTER_CONNECT_TIMEOUT))
                    .set_response_timeout(Some(CLUSTER_RESPONSE_TIMEOUT));
                let nodes = redis_link::ClusterRouter::new(&seeds, config)?;
                Ok(Self::with_connection(conn, Some(Arc::new(nodes))))
            }
        }
    }

    /// The cluster's nodes, `None` on one server.
    pub fn nodes(&self) -> Option<&Arc<redis_link::ClusterRouter>> {
        self.nodes.as_ref()
    }

    /// The text of `INFO section` of every master (of the server on one server), with the master's address.
    ///
    /// # Errors
    /// Redis errors, naming the cluster node.
    pub async fn info(&self, section: &str) -> Result<Vec<(Option<redis_link::NodeAddr>, String)>, StoreError> {
        self.on_each_master(redis::cmd("INFO").arg(section)).await
    }

    /// Which of `names` each master offers (`COMMAND INFO`: a renamed or disabled command is missing).
    ///
    /// # Errors
    /// Redis errors, naming the cluster node.
    pub async fn commands_present(
        &self,
        names: &[&str],
    ) -> Result<Vec<(Option<redis_link::NodeAddr>, Vec<bool>)>, StoreError> {
        let infos: Vec<(Option<redis_link::NodeAddr>, Vec<Value>)> = self
            .on_each_master(redis::cmd("COMMAND").arg("INFO").arg(names))
            .await?;
        Ok(infos
            .into_iter()
            .map(|(node, infos)| {
                let mut present: Vec<bool> = infos.iter().map(|v| !matches!(v, Value::Nil)).collect();
                present.resize(names.len(), false);
                (node, present)
            })
            .collect())
    }

    /// A clone of the underlying connection, for plain commands.
    pub fn connection(&self) -> Connection {
        self.conn.clone()
    }

    /// A new mutex token (32 hex digits: this store's owner id, then 64 random bits).
    pub fn token(&self) -> Token {
        let value = format!("{}{:016x}", self.owner, rand::random::<u64>());
        self.live.lock().expect("live tokens lock").insert(value.clone());
        Token {
            value,
            live: self.live.clone(),
        }
    }

    /// Whether `holder` is a mutex token of this store that no running section holds.
    fn is_stale_own(&self, holder: &str) -> bool {
        holder.len() == self.owner.len() + 16
            && holder.starts_with(&*self.owner)
            && !self.live.lock().expect("live tokens lock").contains(holder)
    }

    /// Tries to take the mutex and load; a stale mutex of this store is deleted and the load tried again once.
    /// `Ok(None)`: the mutex is busy.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for a hash or liveness entry that does not parse (the mutex is then free), Redis
    /// errors and malformed replies.
    pub async fn try_load(
        &self,
        keys: &SectionKeys,
        token: &str,
        mutex_ttl: Duration,
        cached: Option<Cached<'_>>,
        scope: LivenessScope<'_>,
    ) -> Result<Option<Loaded>, StoreError> {
        for _ in 0..2 {
            match self.load_once(keys, token, mutex_ttl, cached, scope).await? {
                Attempt::Loaded(loaded) => return Ok(Some(loaded)),
                Attempt::Busy(holder) if self.is_stale_own(&holder) => {
                    let mut conn = self.conn.clone();
                    let deleted: i64 = self
                        .release
                        .key(&keys.mutex)
                        .key(&keys.hash)
                        .arg(&holder)
                        .invoke_async(&mut conn)
                        .await?;
                    if deleted == 1 {
                        warn!(mutex = %keys.mutex, "deleted a stale mutex of this coordinator (failed section or \
                            Redis restart) instead of waiting for its TTL");
                    }
                }
                Attempt::Busy(_) => return Ok(None),
            }
        }
        Ok(None)
    }

    async fn load_once(
        &self,
        keys: &SectionKeys,
        token: &str,
        mutex_ttl: Duration,
        cached: Option<Cached<'_>>,
        scope: LivenessScope<'_>,
    ) -> Result<Attempt, StoreError> {
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
            .arg(cached.map(|c| c.revision.0.to_string()).unwrap_or_default())
            .arg(cached.map(|c| check_of(c, scope)).unwrap_or_default())
            .arg(keys.schema)
            .arg(LAYOUT_VERSION)
            .arg(scope_arg);
        for m in members {
            inv.arg(m.as_str());
        }
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        match int(&reply, 0)? {
            0 => return Ok(Attempt::Busy(text(&reply, 1)?)),
            2 => return Err(corrupt(keys, &text(&reply, 1)?)),
            _ => {}
        }
        match parse_loaded(&reply, keys) {
            Ok(mut loaded) => {
                if let (true, Some(c)) = (loaded.cache_hit, cached) {
                    loaded.aggregate_digest = c.digest.to_owned();
                }
                if loaded.run_id_changed() && self.nodes.is_some() {
                    self.explain_moved_run_id(keys, &mut loaded).await;
                }
                Ok(Attempt::Loaded(loaded))
            }
            Err(e) => {
                // The script checked every field already; a reply this build cannot parse must not leave the
                // group blocked for a mutex TTL either.
                self.release(keys, token).await?;
                Err(e)
            }
        }
    }

    /// On a cluster a stored run id other than the node's also follows a slot migration, which loses nothing: the
    /// keys moved whole. Told apart from a failover or restart by the stored run id still being a live master's
    /// (a replaced node's run id is nobody's, or a replica's). Then the node's run id is recorded
    /// ([`ADOPT_RUN_ID`]) and the load reports no change. Any doubt (an error, a master's run id unreadable)
    /// leaves the change reported: a needless correction round is safe, a missed one is not.
    async fn explain_moved_run_id(&self, keys: &SectionKeys, loaded: &mut Loaded) {
        let masters = match self.master_run_ids().await {
            Ok(ids) => ids,
            Err(e) => {
                warn!(key = %keys.hash, error = %e, "cannot read the masters' run ids; treating the run id change \
                    as a possible loss");
                return;
            }
        };
        let Some(from) = masters
            .iter()
            .find(|(_, id)| *id == loaded.stored_run_id)
            .map(|(node, _)| node.clone())
        else {
            return;
        };
        let mut conn = self.conn.clone();
        let adopted: Result<i64, _> = self
            .adopt_run_id
            .key(&keys.hash)
            .arg(&loaded.stored_run_id)
            .arg(&loaded.run_id)
            .invoke_async(&mut conn)
            .await;
        match adopted {
            Ok(1) => {
                tracing::info!(key = %keys.hash, from = ?from, run_id = %loaded.run_id,
                    "metadata moved by a slot migration from a live master: not a loss; run id recorded");
                loaded.stored_run_id.clone_from(&loaded.run_id);
            }
            Ok(_) => {}
            Err(e) => warn!(key = %keys.hash, error = %e, "cannot record the run id after a slot migration"),
        }
    }

    /// Compare-and-set write, then releases the mutex (also on conflict and on a corrupt hash).
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] when a field it would read or overwrite does not parse (nothing is written), Redis
    /// errors and malformed replies.
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
            .arg(keys.schema)
            .arg(LAYOUT_VERSION)
            .arg(write.now_ms)
            .arg(write.run_id)
            .arg(write.replaces)
            .arg(write.renew.len());
        for (m, lease) in write.renew {
            inv.arg(m.as_str()).arg(*lease);
        }
        for m in write.forget {
            inv.arg(m.as_str());
        }
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        match int(&reply, 0)? {
            1 => {
                let rev = counter(&text(&reply, 1)?, REVISION_DIGITS)
                    .map_err(|e| corrupt(keys, &format!("revision is {e}")))?
                    .unwrap_or(0);
                Ok(Committed::Ok(StoreRevision(rev)))
            }
            2 => Err(corrupt(keys, &text(&reply, 1)?)),
            _ => Ok(Committed::Conflict),
        }
    }

    /// Releases the mutex if `token` still holds it.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn release(&self, keys: &SectionKeys, token: &str) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: i64 = self
            .release
            .key(&keys.mutex)
            .key(&keys.hash)
            .arg(token)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Reads a hash without the mutex (a snapshot at one revision: the admin view, routing reads), with the
    /// liveness entries when `liveness` is set, and checks it as strictly as `LOAD` does.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for a field that does not parse or a version this build does not understand; Redis
    /// errors.
    pub async fn read(&self, keys: &SectionKeys, liveness: bool) -> Result<Loaded, StoreError> {
        let mut conn = self.conn.clone();
        let mut fields: Vec<&str> = SNAPSHOT_FIELDS.to_vec();
        fields.push(fields::AGGREGATE);
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET").arg(&keys.hash).arg(&fields);
        pipe.cmd("TIME");
        if liveness {
            pipe.cmd("HGETALL").arg(&keys.liveness);
        }
        let replies: Vec<Value> = pipe.query_async(&mut conn).await?;
        let raw = match replies.first() {
            Some(Value::Array(v)) => v.clone(),
            other => return Err(StoreError::Protocol(format!("HMGET replied {other:?}"))),
        };
        let at = |i: usize| text(&raw, i);
        let (secs, micros) = match replies.get(1) {
            Some(Value::Array(t)) => (text(t, 0)?, text(t, 1)?),
            other => return Err(StoreError::Protocol(format!("TIME replied {other:?}"))),
        };
        let mut live = Vec::new();
        match replies.get(2) {
            Some(Value::Array(items)) => live.clone_from(items),
            Some(Value::Map(items)) => {
                for (k, v) in items {
                    live.push(k.clone());
                    live.push(v.clone());
                }
            }
            _ => {}
        }
        let revision = at(0)?;
        let aggregate = match raw.get(6) {
            Some(Value::BulkString(b)) => Some(b.clone()),
            _ => None,
        };
        let fields = Fields {
            revision: &revision,
            liveness_revision: &at(1)?,
            schema: &at(2)?,
            layout: &at(3)?,
            run_id: &at(4)?,
            updated_at: &at(5)?,
        };
        let mut loaded = fields.parse(keys, &secs, &micros, &live)?;
        if loaded.revision.is_some() {
            check_versions(&loaded, keys.schema).map_err(|e| corrupt(keys, &e))?;
        }
        if let Some(json) = &aggregate {
            loaded.aggregate_digest = digest(json);
        }
        loaded.aggregate = aggregate;
        Ok(loaded)
    }

    /// Reads a stream's routing without the mutex (routing reads are snapshots; writes go through the CAS).
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for a hash that does not parse; Redis errors. A bad document is reported by the
    /// caller's decode.
    pub async fn read_routing(&self, stream: &StreamName) -> Result<Option<(StoreRevision, Vec<u8>)>, StoreError> {
        let loaded = self.read(&SectionKeys::routing(stream), false).await?;
        Ok(match (loaded.revision, loaded.aggregate) {
            (Some(rev), Some(agg)) => Some((rev, agg)),
            _ => None,
        })
    }

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

    /// Redis `TIME`, in ms; on a cluster the latest clock of the masters ([`Store::max_time_ms`]).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn time_ms(&self) -> Result<u64, StoreError> {
        self.max_time_ms().await
    }

    /// Whether the hash of `keys` exists in any form (a damaged hash without a revision too).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn hash_exists(&self, keys: &SectionKeys) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let n: i64 = redis::cmd("EXISTS").arg(&keys.hash).query_async(&mut conn).await?;
        Ok(n == 1)
    }

    /// Deletes the liveness hash of `keys` (what a lost group left behind, before its recreation).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn clear_liveness(&self, keys: &SectionKeys) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: () = redis::cmd("DEL").arg(&keys.liveness).query_async(&mut conn).await?;
        Ok(())
    }

    /// Redis `run_id` (changes when the server restarts). On a cluster, one text naming every master and its run
    /// id (`host:port=run id`, sorted, comma-separated): it changes when any master restarts or a replica takes
    /// over, which is what the global expiry grace is for. The per-group check does not use it: `LOAD` reads the
    /// run id of the node holding the group.
    ///
    /// # Errors
    /// Redis errors (naming the cluster node), or a reply without `run_id`.
    pub async fn run_id(&self) -> Result<String, StoreError> {
        let ids = self.master_run_ids().await?;
        let mut parts: Vec<String> = ids
            .into_iter()
            .map(|(node, id)| match node {
                Some(node) => format!("{node}={id}"),
                None => id,
            })
            .collect();
        parts.sort();
        Ok(parts.join(","))
    }
}

/// The groups of the index's `stream:group` members; members that are not valid names are skipped. Sorted.
pub fn group_refs(raw: &[String]) -> Vec<GroupRef> {
    let mut groups: Vec<GroupRef> = raw
        .iter()
        .filter_map(|s| {
            let (stream, group) = s.split_once(':')?;
            Some(GroupRef {
                stream: StreamName::new(stream).ok()?,
                group: GroupName::new(group).ok()?,
            })
        })
        .collect();
    groups.sort();
    groups
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

/// Decodes a routing document whose hash fields were checked already ([`check_versions`], or the checks of
/// [`Store::read`]).
///
/// # Errors
/// A sentence for the `METADATA_UNAVAILABLE` answer.
pub fn decode_routing(json: &[u8]) -> Result<StreamRouting, String> {
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

/// What one `LOAD` attempt found.
enum Attempt {
    Loaded(Loaded),
    /// The mutex is held by this token.
    Busy(String),
}

/// The hash fields every read checks (the aggregate aside), in `FIELDS` order of the scripts.
const SNAPSHOT_FIELDS: [&str; 6] = [
    fields::REVISION,
    fields::LIVENESS_REVISION,
    fields::SCHEMA_VERSION,
    fields::LAYOUT_VERSION,
    fields::RUN_ID,
    fields::UPDATED_AT,
];

/// Digits of a revision: exact as a Redis integer (`HINCRBY`).
const REVISION_DIGITS: usize = 18;
/// Digits of a schema or layout version: a `u32` without truncation.
const VERSION_DIGITS: usize = 9;
/// Digits of a time or lease in ms: exact as a Lua number.
const TIME_DIGITS: usize = 15;
/// Length of a Redis run id.
const RUN_ID_LEN: usize = 40;

/// The text of a hash's fields, parsed strictly by [`Fields::parse`] (the Rust twin of the scripts' checks).
struct Fields<'a> {
    revision: &'a str,
    liveness_revision: &'a str,
    schema: &'a str,
    layout: &'a str,
    run_id: &'a str,
    updated_at: &'a str,
}

impl Fields<'_> {
    fn parse(&self, keys: &SectionKeys, secs: &str, micros: &str, live: &[Value]) -> Result<Loaded, StoreError> {
        let field = |name: &str, value: &str, digits: usize| {
            counter(value, digits).map_err(|e| corrupt(keys, &format!("{name} is {e}")))
        };
        let revision = field("revision", self.revision, REVISION_DIGITS)?.map(StoreRevision);
        let liveness_revision = field("livenessRevision", self.liveness_revision, REVISION_DIGITS)?.unwrap_or(0);
        let version = |name: &str, value: &str| -> Result<Option<u32>, StoreError> {
            field(name, value, VERSION_DIGITS)?
                .map(|v| u32::try_from(v).map_err(|e| corrupt(keys, &format!("{name} is {e}"))))
                .transpose()
        };
        let schema_version = version("schemaVersion", self.schema)?;
        let layout_version = version("layoutVersion", self.layout)?;
        field("updatedAt", self.updated_at, TIME_DIGITS)?;
        let run_id_ok = self.run_id.is_empty()
            || (self.run_id.len() == RUN_ID_LEN && self.run_id.bytes().all(|b| b.is_ascii_hexdigit()));
        if !run_id_ok {
            return Err(corrupt(keys, &format!("runId is {}", quoted(self.run_id))));
        }
        let mut liveness = Vec::with_capacity(live.len() / 2);
        for pair in live.chunks(2) {
            let (Some(k), Some(v)) = (pair.first(), pair.get(1)) else {
                return Err(StoreError::Protocol("odd liveness reply".into()));
            };
            let (k, v) = (value_text(k)?, value_text(v)?);
            let member = MemberId::new(k.as_str())
                .map_err(|e| corrupt(keys, &format!("liveness member {} is invalid: {e}", quoted(&k))))?;
            let lease = counter(&v, TIME_DIGITS)
                .map_err(|e| corrupt(keys, &format!("liveness of {} is {e}", quoted(&k))))?
                .ok_or_else(|| corrupt(keys, &format!("liveness of {} is empty", quoted(&k))))?;
            liveness.push((member, lease));
        }
        let secs = secs.parse::<u64>().map_err(bad)?;
        let micros = micros.parse::<u64>().map_err(bad)?;
        Ok(Loaded {
            now_ms: time_ms(secs, micros),
            revision,
            liveness_revision,
            schema_version,
            layout_version,
            aggregate: None,
            aggregate_digest: String::new(),
            cache_hit: false,
            liveness,
            stored_run_id: self.run_id.to_owned(),
            run_id: String::new(),
            liveness_missing: false,
        })
    }
}

/// Parses a `LOAD` reply that took the mutex.
fn parse_loaded(reply: &[Value], keys: &SectionKeys) -> Result<Loaded, StoreError> {
    let live = match reply.get(8) {
        Some(Value::Array(items)) => items.as_slice(),
        _ => &[],
    };
    let fields = Fields {
        revision: &text(reply, 3)?,
        liveness_revision: &text(reply, 4)?,
        schema: &text(reply, 5)?,
        layout: &text(reply, 6)?,
        run_id: &text(reply, 9)?,
        updated_at: "",
    };
    let mut loaded = fields.parse(keys, &text(reply, 1)?, &text(reply, 2)?, live)?;
    loaded.aggregate = match reply.get(7) {
        Some(Value::BulkString(b)) if !b.is_empty() => Some(b.clone()),
        _ => None,
    };
    if let Some(json) = &loaded.aggregate {
        loaded.aggregate_digest = digest(json);
    }
    loaded.run_id = text(reply, 10)?;
    loaded.liveness_missing = int(reply, 11)? == 0;
    loaded.cache_hit = int(reply, 12)? == 1;
    Ok(loaded)
}

/// What `LOAD` compares with the stored aggregate: its length on every load (O(1) in Redis), its digest on
/// loads of all liveness (ticks and fences, a few per second per group) so that an edit that keeps the length is
/// noticed within a tick, without hashing a large aggregate on every heartbeat.
fn check_of(cached: Cached<'_>, scope: LivenessScope<'_>) -> String {
    match scope {
        LivenessScope::All => format!("sha1:{}", cached.digest),
        _ => format!("len:{}", cached.len),
    }
}

/// Redis `TIME` (seconds, microseconds) in ms.
fn time_ms(secs: u64, micros: u64) -> u64 {
    secs * 1000 + micros / 1000
}

/// The digest `LOAD` compares with a cached aggregate's: SHA-1 in hex, as Redis's `redis.sha1hex`.
pub fn digest(json: &[u8]) -> String {
    sha1_smol::Sha1::from(json).digest().to_string()
}

/// A canonical decimal of at most `digits` digits; empty is `None`. The error quotes the value.
fn counter(s: &str, digits: usize) -> Result<Option<u64>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let canonical = s.len() <= digits && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if !canonical {
        return Err(quoted(s));
    }
    s.parse().map(Some).map_err(|_| quoted(s))
}

/// A stored value for a message: quoted, and cut so a huge field does not flood a log line.
fn quoted(s: &str) -> String {
    let cut: String = s.chars().take(40).collect();
    format!("{cut:?}")
}

fn corrupt(keys: &SectionKeys, why: &str) -> StoreError {
    StoreError::Corrupt(format!("{} is unreadable: {why}", keys.hash))
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
        Some(v) => value_text(v),
        None => Ok(String::new()),
    }
}

fn value_text(v: &Value) -> Result<String, StoreError> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).map_err(bad),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(n) => Ok(n.to_string()),
        Value::Nil => Ok(String::new()),
        other => Err(StoreError::Protocol(format!("expected text, got {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_canonical_decimals() {
        assert_eq!(counter("", REVISION_DIGITS), Ok(None));
        assert_eq!(counter("0", REVISION_DIGITS), Ok(Some(0)));
        assert_eq!(counter("42", REVISION_DIGITS), Ok(Some(42)));
        for bad in ["07", "-1", "+1", " 1", "1 ", "1e3", "0x10", "12x", "１"] {
            assert!(counter(bad, REVISION_DIGITS).is_err(), "{bad:?}");
        }
        assert_eq!(
            counter("999999999999999999", REVISION_DIGITS),
            Ok(Some(999_999_999_999_999_999))
        );
        assert!(counter("1000000000000000000", REVISION_DIGITS).is_err(), "19 digits");
    }

    #[test]
    fn versions_are_never_truncated() {
        let keys = SectionKeys::routing(&StreamName::new("s").unwrap());
        let fields = |schema| Fields {
            revision: "1",
            liveness_revision: "0",
            schema,
            layout: "1",
            run_id: "",
            updated_at: "",
        };
        let parsed = fields("1").parse(&keys, "1", "0", &[]).unwrap();
        assert_eq!(parsed.schema_version, Some(1));
        // 2^32 + 1 would be 1 after an `as u32`.
        let err = fields("4294967297").parse(&keys, "1", "0", &[]).unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt(ref m) if m.contains("schemaVersion")),
            "{err:?}"
        );
    }
}

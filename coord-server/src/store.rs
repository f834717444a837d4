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
//!
//! A group's hash keeps its document in fields ([`group_fields`]) and runs `GROUP_LOAD` / `GROUP_COMMIT`
//! ([`group_io`]) instead: the same contract, but a load sends only the changes since the caller's revision and
//! a commit writes only the changed fields (each checked against the digest the decision read).
//!
//! # Layout
//! * `scripts`: the Lua of `LOAD`, `COMMIT`, `GROUP_LOAD`, `GROUP_COMMIT`, `ADOPT_RUN_ID` and `RELEASE`;
//!   `group_fields`: the field layout of a group (pure); `group_io`: its round trips; `section_data`: the keys, loads, writes
//!   and tokens they work on; `section`: the round trips themselves and the snapshot reads; `decode`: the strict
//!   parsing of replies, fields and documents; `index`: the rebuildable groups and streams indexes.
//! * Two Redis targets ([`Store::connect_split`]): `self` holds the coordinator's keys, [`Store::data`] the shard
//!   streams and fences; one store serves both when no metadata Redis is configured.
//! * [`nodes`]: what every master of a cluster answers; [`lag`]: the lag scrape; [`usage`]: shard length and
//!   memory; [`traces`]: "never created" or
//!   "lost"; [`reshard`]: the seal, record and drain scripts of resharding; `quota_mutex`: a token's group-create
//!   mutex.

use redis::aio::ConnectionManager;
use redis::{Script, Value};
use redis_link::{Connection, RedisTarget};
use std::collections::HashSet;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use crate::error::StoreError;
use scripts::{ADOPT_RUN_ID, COMMIT, FIELD_CHECKS, GROUP_COMMIT, GROUP_HELPERS, GROUP_LOAD, LOAD, RELEASE};

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

mod decode;
mod due;
pub mod group_fields;
mod group_io;
mod index;
pub mod lag;
pub mod nodes;
mod quota_mutex;
pub mod reshard;
mod scripts;
mod section;
mod section_data;
pub mod traces;
pub mod usage;

pub use decode::{
    check_versions, decode_group, decode_routing, digest, group_refs, schema_of_group, schema_of_routing,
    UNREADABLE_LEASE_MS,
};
pub use due::DueScore;
pub use scripts::script_sources;
pub use section_data::{Cached, Committed, FieldWrite, LivenessScope, Loaded, SectionKeys, Token, Write};
// `nodes` reads the masters' clocks with the same conversion as `LOAD`.
use decode::time_ms;

/// Redis access of the coordinator.
#[derive(Clone)]
pub struct Store {
    conn: Connection,
    /// The cluster's nodes (for what every master must answer), `None` on one server.
    nodes: Option<Arc<redis_link::ClusterRouter>>,
    load: Script,
    commit: Script,
    group_load: Script,
    group_commit: Script,
    release: Script,
    adopt_run_id: Script,
    /// Prefix of this store's mutex tokens (random per process).
    owner: Arc<str>,
    /// Tokens of the sections running now.
    live: Arc<StdMutex<HashSet<String>>>,
    /// The Redis of the shard streams and their fences when the metadata has a Redis of its own (`None`: this
    /// one holds both). See [`Store::data`].
    data: Option<Arc<Store>>,
    /// This process's queue per token group-create mutex: its creates of one token wait here in turn, so one
    /// of them at a time asks Redis (see `quota_mutex`).
    quota_queues: quota_mutex::Queues,
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
            group_load: Script::new(&format!("{FIELD_CHECKS}{GROUP_HELPERS}{GROUP_LOAD}")),
            group_commit: Script::new(&format!("{FIELD_CHECKS}{GROUP_HELPERS}{GROUP_COMMIT}")),
            release: Script::new(RELEASE),
            adopt_run_id: Script::new(ADOPT_RUN_ID),
            owner: format!("{:016x}", rand::random::<u64>()).into(),
            live: Arc::default(),
            data: None,
            quota_queues: Arc::default(),
        }
    }

    /// Connects to two Redis targets: `metadata_url` for the coordinator's own keys (`redis-stream:coord:*`:
    /// group and routing hashes, liveness, mutexes, indexes; its `TIME` and run id) and `data_url` for what must
    /// sit next to the stream data: the shard streams and the shard records and fences
    /// (`redis-stream:shard-fence:*`), which producers check in the same transaction or script as their `XADD`,
    /// so a seal written anywhere else would fence nobody. Stream data filling the data Redis up then cannot stop
    /// heartbeats or metadata commits. With `metadata_url` `None` this is [`Store::connect`] of `data_url`.
    ///
    /// # Errors
    /// A malformed URL; either Redis unreachable.
    pub async fn connect_split(
        data_url: &str,
        metadata_url: Option<&str>,
        tls: Option<&redis_link::TlsOptions>,
    ) -> Result<Self, StoreError> {
        let Some(metadata_url) = metadata_url else {
            return Self::connect_tls(data_url, tls).await;
        };
        let mut metadata = Self::connect_tls(metadata_url, tls).await?;
        metadata.data = Some(Arc::new(Self::connect_tls(data_url, tls).await?));
        Ok(metadata)
    }

    /// The store of the data Redis: shard streams, dead-letter streams, shard records and fences, the lag and
    /// memory of the shards. `self` unless the metadata has a Redis of its own ([`Store::connect_split`]).
    pub fn data(&self) -> &Store {
        self.data.as_deref().unwrap_or(self)
    }

    /// Whether the metadata lives on a Redis of its own (see [`Store::connect_split`]).
    pub fn split(&self) -> bool {
        self.data.is_some()
    }

    /// Connects to the Redis that `url` names: one server's URL, or `cluster:` and seed URLs (see
    /// [`RedisTarget`]). The connection reconnects by itself afterwards; on a cluster it follows `MOVED`, `ASK`
    /// and failovers (a retried write is harmless: every write is a revision compare-and-set or idempotent).
    ///
    /// # Errors
    /// A malformed URL; Redis unreachable.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_tls(url, None).await
    }

    /// [`Store::connect`], `rediss://` connections verified and authenticated with `tls` (the system's roots
    /// when `None`); a failed connection names the URL and, for TLS, the cause.
    ///
    /// # Errors
    /// As [`Store::connect`]; TLS settings that cannot be used.
    pub async fn connect_tls(url: &str, tls: Option<&redis_link::TlsOptions>) -> Result<Self, StoreError> {
        let tls = tls.map(redis_link::RedisTls::load).transpose().map_err(|e| {
            StoreError::Redis(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "Redis TLS",
                e.to_string(),
            )))
        })?;
        let explain = |e: redis::RedisError| StoreError::Redis(redis_link::explain_connect_error(url, e));
        let target = RedisTarget::parse(url).map_err(|e| {
            StoreError::Redis(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "invalid Redis target",
                e.to_string(),
            )))
        })?;
        match target {
            RedisTarget::Single(url) => {
                let client = redis_link::tls_client(&url, tls.as_ref())?;
                Ok(Store::new(ConnectionManager::new(client).await.map_err(explain)?))
            }
            RedisTarget::Cluster(seeds) => {
                let client = redis_link::cluster_builder(&seeds, tls.as_ref())?
                    .connection_timeout(CLUSTER_CONNECT_TIMEOUT)
                    .response_timeout(CLUSTER_RESPONSE_TIMEOUT)
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(CLUSTER_MIN_RETRY_WAIT_MS)
                    .max_retry_wait(CLUSTER_MAX_RETRY_WAIT_MS)
                    .retry_wait_formula(10, 2)
                    .build()?;
                let conn = Connection::Cluster(client.get_async_connection().await.map_err(explain)?);
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CLUSTER_CONNECT_TIMEOUT))
                    .set_response_timeout(Some(CLUSTER_RESPONSE_TIMEOUT));
                let nodes = redis_link::ClusterRouter::new(&seeds, config, tls.as_ref())?;
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

    /// A clone of the underlying connection, for plain commands. Shard keys (streams, records, fences) are on
    /// [`Store::data`]'s connection, not necessarily this one.
    pub fn connection(&self) -> Connection {
        self.conn.clone()
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

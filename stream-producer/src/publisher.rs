//! Publishing: routes records to shards and writes them with pipelined `XADD`s, one pipeline per shard.
//!
//! # Routing of records
//! * A record with a key goes to [`protocol::routing::shard_for_key`]`(key, shard_count)` (xxHash64 + jump
//!   consistent hash), so all records of one key land on one shard, in order, while the shard count holds.
//! * A record without a key goes round-robin over the shards (a per-producer counter), which spreads load
//!   evenly and promises no order between such records.
//!
//! # Connections
//! The publisher holds a fixed number of *lanes*, each one pipelining connection
//! ([`redis_link::PipelinedConnection`]) shared by every request given to it. Shard `s` always uses lane
//! `s % lanes`, so the pipelines of one shard are written in the order they were issued. A lane connects lazily
//! and, after a transport error, reconnects on its next use. The `XADD`s of the single-server paths are written
//! as RESP straight into one buffer per pipeline ([`redis_link::resp`]), not as a redis-rs `Cmd` each: on the
//! publish path that was most of the client's CPU per record (issue 17).
//!
//! # The fence
//! By default ([`ProducerConfig::fencing`](crate::ProducerConfig::fencing)) every shard batch (split at 512
//! records) is checked against the shard's fence atomically with its writes and written whole or not at all. On one
//! server without idempotence it is a checked transaction: `WATCH` and a read of the fence, then `MULTI`, the
//! `XADD`s and `EXEC` on the same connection, which the lane carries alone from the check until `EXEC` is handed
//! over ([`transaction`]). The
//! idempotent producer and a Redis Cluster send one `EVALSHA` of the publish script per batch instead
//! ([`crate::publish_script`]); the script calls of one shard go in one pipeline, as the `XADD`s do. A fenced batch
//! fails with [`PublishError::Fenced`] (not written).
//!
//! # Idempotent producer
//! With [`idempotence`](crate::ProducerBuilder::idempotence) every call carries the producer id, the instance's
//! epoch and the sequence number of its first record; the producer sends at most one call per shard at a time
//! (a per-shard async lock) and retries a call whose outcome is unknown with the same numbers, so the script
//! recognises a retry of a call it already wrote and answers with the original ids. Sequence numbers advance
//! only when a call was written (or its outcome stayed unknown after every retry: the next call then says a
//! gap is expected); a call refused as not written leaves them for the next call.
//!
//! # Outcomes
//! The lane knows whether a request left: a failure to *open* the connection means nothing was sent
//! ([`PublishError::Connect`], not written); a failure after the pipeline was handed to an open connection (reset,
//! EOF, timeout) means Redis may have executed any prefix of it ([`PublishError::ConnectionLost`], unknown). An
//! error reply to one `XADD` fails that record only ([`PublishError::Rejected`], not written). A durable producer
//! ends every write request with `WAIT`; records it does not confirm are [`PublishError::NotReplicated`],
//! unknown ([`durable`]).
//!
//! # Redis check
//! The first connection any lane opens is checked before it is used ([`client_core::check_redis`]): the Redis
//! version and every command the producer sends ([`REDIS_REQUIREMENTS`]). A server that cannot serve the
//! producer (too old, a command missing or renamed) fails every publish with [`PublishError::RedisUnsupported`]
//! naming the command and the URL (without password), for the life of the producer; a check cut short by a
//! transport error is a connection failure and is taken again on the next connection.
//!
//! # Redis Cluster
//! With a `cluster:` target the lanes are per node: each master gets `connections` lanes of its own (opened on
//! first use, checked and given the publish script like any lane), and a shard's pipeline goes straight to the
//! master of its key's slot, on lane `s % connections` of that master ([`cluster`]). redis-rs's cluster
//! connection is not used for writes: on a redirect it re-sends a whole pipeline, re-running the commands that
//! had run. Instead every reply is read on its own: a normal reply settles its command; `MOVED` and `ASK` say the
//! command did not run, and the redirected commands (only those, in their order) are sent again to the named
//! node (`ASK`: each preceded by `ASKING`; `MOVED`: the slot map is refreshed too); `TRYAGAIN` and `CLUSTERDOWN`
//! are sent again after a short backoff. A call follows at most [`cluster::MAX_REDIRECTS`] redirects in a row
//! and retries until one response timeout after it started; past that its unsettled commands fail as not
//! written ([`PublishError::ClusterUnsettled`]). A node that cannot be reached is retried the same way (after a
//! slot map refresh: a failover may have moved its slots). A connection that fails after sending leaves its
//! commands unknown, as on one server. The pipelines of one shard still settle in issue order: a pipeline
//! handles its redirects only after the shard's previous pipeline settled; a new pipeline is sent right after the
//! shard's previous one was handed to the same node (one lane keeps their order), and waits for it to settle when
//! it went to another node (the slot map changed meanwhile) or while one of the shard's pipelines is settling
//! redirects.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::fence::Presented;
use protocol::names::StreamName;
use protocol::routing::shard_for_key;
use protocol::{keys, EntryId, RoutingVersion, ShardId};
use redis::{RedisError, Value};
use redis_link::{resp, PipelinedConnection};

use client_core::redis_check::MIN_REDIS_VERSION;
use client_core::{check_redis, RedisCheckError, RedisRequirements};

use crate::config::{IdempotenceConfig, Trim, IDEMPOTENT_RETRY_MAX};
use crate::error::PublishError;
use crate::publish_script::{
    self, args_of, parse_reply, PublishScript, ScriptReply, ScriptTrim, Sequence, MAX_ARGS_PER_CALL,
    MAX_FIELDS_PER_RECORD, MAX_RECORDS_PER_CALL,
};
use crate::routing_cache::RoutingInfo;
use crate::stats::Stats;

pub(crate) mod cluster;
mod durable;
mod transaction;

use durable::{Durable, Replication};

pub(crate) use crate::published::Published;

/// One record to publish: an optional routing key and the entry's fields.
///
/// The key only chooses the shard; it is not written into the entry. Put it in a field too if consumers need it.
///
/// ```
/// use stream_producer::Record;
///
/// let r = Record::with_key("customer-42").field("type", "order-created").field("amount", "12.50");
/// assert_eq!(r.key(), Some(&b"customer-42"[..]));
/// let keyless = Record::without_key().field("ping", "1");
/// assert!(keyless.key().is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    key: Option<Vec<u8>>,
    fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Record {
    /// A record routed by `key`.
    pub fn with_key(key: impl Into<Vec<u8>>) -> Self {
        Record {
            key: Some(key.into()),
            fields: Vec::new(),
        }
    }

    /// A record without a key (routed round-robin).
    pub fn without_key() -> Self {
        Record::default()
    }

    /// A record from a key and fields.
    pub fn new<N, V>(key: Option<Vec<u8>>, fields: impl IntoIterator<Item = (N, V)>) -> Self
    where
        N: Into<Vec<u8>>,
        V: Into<Vec<u8>>,
    {
        Record {
            key,
            fields: fields.into_iter().map(|(n, v)| (n.into(), v.into())).collect(),
        }
    }

    /// Adds a field.
    pub fn field(mut self, name: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        self.fields.push((name.into(), value.into()));
        self
    }

    /// The routing key.
    pub fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }

    /// The fields, in order.
    pub fn fields(&self) -> &[(Vec<u8>, Vec<u8>)] {
        &self.fields
    }

    /// Bytes of the key, field names and values (what the batching mode's in-flight budget counts).
    pub(crate) fn payload_len(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len) + self.fields.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>()
    }

    pub(crate) fn check(&self) -> Result<(), PublishError> {
        if self.fields.is_empty() {
            return Err(PublishError::InvalidRecord("a stream entry needs at least one field"));
        }
        Ok(())
    }
}

/// What the producer needs from its Redis: `XADD` (with `MINID` trimming, hence 6.2), and `EVALSHA` / `SCRIPT`
/// for the fenced publish script.
pub const REDIS_REQUIREMENTS: RedisRequirements = RedisRequirements {
    min_version: MIN_REDIS_VERSION,
    commands: &[
        ("XADD", "publishing"),
        ("EVALSHA", "publishing through the fenced script"),
        ("SCRIPT", "loading the fenced publish script"),
        ("WATCH", "checking the fence of a transaction"),
        ("UNWATCH", "checking the fence of a transaction"),
        ("HGET", "reading a shard's fence"),
        ("MULTI", "writing a checked transaction"),
        ("EXEC", "writing a checked transaction"),
        ("DISCARD", "leaving a fenced transaction"),
    ],
};

/// Why no connection could be used. Cheap to clone: one failure is shared by every caller that waited for it.
#[derive(Debug, Clone)]
pub(crate) enum ConnectFailure {
    /// The connection could not be opened (or the check was cut short): nothing was sent.
    Redis(Arc<RedisError>),
    /// The server cannot serve the producer: nothing was sent, and nothing will be.
    Unsupported(Arc<RedisCheckError>),
}

impl ConnectFailure {
    pub(crate) fn into_publish_error(self, shard: ShardId) -> PublishError {
        match self {
            ConnectFailure::Redis(source) => PublishError::Connect { shard, source },
            ConnectFailure::Unsupported(source) => PublishError::RedisUnsupported { source },
        }
    }
}

/// The capability check, taken once on the first connection any lane opens.
struct RedisGate {
    url: String,
    /// `Ok(Ok)`: passed; `Ok(Err)`: the server cannot serve the producer. A transport failure during the check
    /// leaves it unset, to be taken again.
    verdict: tokio::sync::OnceCell<Result<(), Arc<RedisCheckError>>>,
    /// What the producer's settings need beyond [`REDIS_REQUIREMENTS`] (`WAIT` for durable writes).
    also: Option<&'static RedisRequirements>,
}

impl RedisGate {
    fn new(url: String, also: Option<&'static RedisRequirements>) -> Self {
        RedisGate {
            url,
            verdict: tokio::sync::OnceCell::new(),
            also,
        }
    }

    async fn check(&self, con: &PipelinedConnection) -> Result<(), ConnectFailure> {
        let verdict = self
            .verdict
            .get_or_try_init(|| async {
                let mut con = con.clone();
                let mut checked = check_redis(&mut con, &self.url, &REDIS_REQUIREMENTS).await;
                if let (Ok(_), Some(also)) = (&checked, self.also) {
                    checked = check_redis(&mut con, &self.url, also).await;
                }
                match checked {
                    Ok(caps) => {
                        tracing::debug!(redis_version = %caps.version, "Redis check passed");
                        Ok(Ok(()))
                    }
                    Err(e) if e.is_unsupported() => {
                        tracing::error!(error = %e, "Redis cannot serve the producer; every publish fails");
                        Ok(Err(Arc::new(e)))
                    }
                    Err(e) => Err(e),
                }
            })
            .await;
        match verdict {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ConnectFailure::Unsupported(e.clone())),
            Err(RedisCheckError::Query { source, .. }) => Err(ConnectFailure::Redis(Arc::new(source))),
            Err(other) => Err(ConnectFailure::Unsupported(Arc::new(other))),
        }
    }
}

/// The timeouts of every lane's connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneTimeouts {
    /// Opening a connection (and its `AUTH` / `SELECT`).
    pub(crate) connect: Duration,
    /// Waiting for the replies of one request.
    pub(crate) response: Duration,
}

/// One pipelining connection, opened lazily and replaced after a transport error.
struct Lane {
    gate: Arc<RedisGate>,
    client: redis::Client,
    timeouts: LaneTimeouts,
    /// The open connection and its generation (so a stale failure does not drop a newer connection).
    /// A std mutex: held only to clone or swap the handle.
    current: Mutex<Option<(u64, PipelinedConnection)>>,
    /// Serialises connection attempts (single flight): a burst of publishes opens one connection, not one each.
    connecting: tokio::sync::Mutex<ConnectState>,
    /// Mirror of `ConnectState::attempts`, readable without waiting for the lock.
    attempts: AtomicU64,
    /// Callers on the slow path of [`Lane::connection`] (queued behind a connection attempt or making one). While
    /// any are, a new caller queues too instead of taking an open connection at once: the lock is FIFO, so the
    /// pipelines of one shard reach the connection in the order they were issued (a pipeline issued after the
    /// connection opened must not overtake one that was waiting for it).
    waiting: AtomicU64,
    generation: AtomicU64,
    /// Loads the publish script on every new connection (scripted path).
    preload_script: bool,
    /// The checked transactions of this lane ([`transaction`]): the batches waiting, and the turn of the one
    /// caller that writes all of them while the connection carries nothing else.
    transactions: transaction::Transactions,
}

/// What the last connection attempt left behind.
#[derive(Default)]
struct ConnectState {
    /// Finished attempts so far. A caller that waited through someone else's failed attempt shares its error
    /// instead of trying again at once: Redis being down must not cost one connect timeout per waiting publish.
    attempts: u64,
    last_error: Option<ConnectFailure>,
}

/// Why a lane could not run a pipeline.
enum LaneError {
    /// The connection could not be opened (or its server cannot serve the producer): nothing was sent.
    Connect(ConnectFailure),
    /// The pipeline was handed to an open connection and then failed: outcome unknown.
    Lost(RedisError),
}

impl Lane {
    fn new(gate: Arc<RedisGate>, client: redis::Client, timeouts: LaneTimeouts, preload_script: bool) -> Self {
        Lane {
            gate,
            client,
            timeouts,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(ConnectState::default()),
            attempts: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            preload_script,
            transactions: transaction::Transactions::default(),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(u64, PipelinedConnection)>> {
        self.current.lock().expect("the lane lock is never held across a panic")
    }

    async fn connection(&self) -> Result<(u64, PipelinedConnection), ConnectFailure> {
        if self.waiting.load(Ordering::Acquire) == 0 {
            if let Some(c) = self.slot().clone() {
                return Ok(c);
            }
        }
        // Declared before the lock guard: dropped after it, so a caller arriving between the two still queues.
        let _waiting = InFlightGuard::enter(&self.waiting);
        let seen = self.attempts.load(Ordering::Acquire);
        let mut state = self.connecting.lock().await;
        if let Some(c) = self.slot().clone() {
            return Ok(c);
        }
        if let Some(e) = state.last_error.as_ref().filter(|_| state.attempts != seen) {
            return Err(e.clone());
        }
        let result = PipelinedConnection::connect(
            self.client.get_connection_info(),
            Some(self.timeouts.connect),
            Some(self.timeouts.response),
        )
        .await;
        state.attempts += 1;
        self.attempts.store(state.attempts, Ordering::Release);
        match result {
            Ok(con) => {
                if let Err(f) = self.gate.check(&con).await {
                    state.last_error = Some(f.clone());
                    return Err(f);
                }
                if self.preload_script {
                    let load = redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(PublishScript::source())
                        .query_async::<String>(&mut con.clone())
                        .await;
                    if let Err(e) = load {
                        let f = ConnectFailure::Redis(Arc::new(e));
                        state.last_error = Some(f.clone());
                        return Err(f);
                    }
                }
                state.last_error = None;
                let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
                *self.slot() = Some((generation, con.clone()));
                Ok((generation, con))
            }
            Err(e) => {
                let f = ConnectFailure::Redis(Arc::new(e));
                state.last_error = Some(f.clone());
                Err(f)
            }
        }
    }

    fn discard(&self, generation: u64) {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|(g, _)| *g == generation) {
            *slot = None;
        }
    }

    /// Runs a pipeline whose replies may individually be errors.
    async fn run(&self, pipe: &redis::Pipeline) -> Result<Vec<redis::RedisResult<Value>>, LaneError> {
        let (generation, mut con) = self.connection().await.map_err(LaneError::Connect)?;
        self.query(generation, &mut con, pipe).await.map_err(LaneError::Lost)
    }

    /// Runs a pipeline on this lane's connection of `generation`, its replies individually errors or not.
    async fn query(
        &self,
        generation: u64,
        con: &mut PipelinedConnection,
        pipe: &redis::Pipeline,
    ) -> Result<Vec<redis::RedisResult<Value>>, RedisError> {
        pipe.query_async::<Vec<redis::RedisResult<Value>>>(con)
            .await
            .inspect_err(|_| {
                // Whatever went wrong after the request was handed over, the connection is suspect: the next use
                // opens a fresh one.
                self.discard(generation);
            })
    }

    /// Runs `count` RESP-encoded commands, connecting first if needed; one reply each (see [`reply_of`]).
    async fn run_packed(
        &self,
        commands: Vec<bytes::Bytes>,
        count: usize,
    ) -> Result<Vec<redis::RedisResult<Value>>, LaneError> {
        let (generation, con) = self.connection().await.map_err(LaneError::Connect)?;
        match con.send_parts(commands, count).await {
            Ok(replies) => Ok(replies.into_iter().map(reply_of).collect()),
            Err(e) => {
                // As in `query`: after a failure the connection is suspect.
                self.discard(generation);
                Err(LaneError::Lost(e))
            }
        }
    }
}

/// Keeps the in-flight gauge right even when a publish future is dropped mid-flight.
struct InFlightGuard<'a>(&'a AtomicU64);

impl<'a> InFlightGuard<'a> {
    fn enter(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        InFlightGuard(gauge)
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The idempotent producer's identity and per-shard sequences.
struct Idempotence {
    producer_id: String,
    /// Random per producer instance: a restarted producer with the same id is a new sequence, not a retry.
    epoch: String,
    idle_ms: u64,
    max_retries: u32,
    /// One lock per shard written so far (bounded by the shard count): held while the shard's call is in flight.
    shards: Mutex<HashMap<ShardId, Arc<tokio::sync::Mutex<ShardSequence>>>>,
}

/// The sequence of one shard.
#[derive(Debug, Default)]
struct ShardSequence {
    /// The sequence number of the next record.
    next: u64,
    /// The previous call's outcome stayed unknown: its numbers were skipped, so the shard may see a gap.
    gap: bool,
}

impl Idempotence {
    fn new(config: IdempotenceConfig) -> Self {
        Idempotence {
            producer_id: config.producer_id.unwrap_or_else(|| format!("p-{}", random_hex())),
            epoch: random_hex(),
            idle_ms: u64::try_from(config.idle_expiry.as_millis()).unwrap_or(u64::MAX),
            max_retries: config.max_retries,
            shards: Mutex::default(),
        }
    }

    fn shard(&self, shard: ShardId) -> Arc<tokio::sync::Mutex<ShardSequence>> {
        self.shards
            .lock()
            .expect("the sequence map lock is never held across a panic")
            .entry(shard)
            .or_default()
            .clone()
    }
}

/// 128 random bits in hex, from the standard library's randomly seeded hasher (no extra dependency; uniqueness,
/// not secrecy, is what a producer id needs).
fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    (0..2u64)
        .map(|i| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(i);
            h.write_u128(now);
            h.write_u32(std::process::id());
            format!("{:016x}", h.finish())
        })
        .collect()
}

/// The scripted publish path.
struct Scripted {
    script: PublishScript,
    idempotence: Option<Idempotence>,
}

/// One script call: its records and, when idempotent, its sequence.
struct CallSpec<'a> {
    records: &'a [&'a Record],
    sequence: Option<Sequence<'a>>,
}

/// What one script call came to.
enum CallOutcome {
    Reply(ScriptReply),
    /// An error reply (nothing executed, or the script refused before writing).
    Rejected(Arc<RedisError>),
    Connect(ConnectFailure),
    Lost(Arc<RedisError>),
    /// On a cluster: not run, the slot did not settle in time.
    Unsettled(&'static str, Arc<RedisError>),
    Unexpected(String),
}

/// What became of one command of a shard's pipeline.
pub(crate) enum CmdOutcome {
    /// Redis's reply (an error reply is a command that did not write).
    Reply(redis::RedisResult<Value>),
    /// Not sent: no connection.
    Connect(ConnectFailure),
    /// Sent, and the connection failed before the reply: unknown.
    Lost(Arc<RedisError>),
    /// On a cluster: redirected or told to retry until a bound was reached; not run.
    Unsettled(&'static str, Arc<RedisError>),
    /// A reply that does not fit the request (unknown).
    Unexpected(String),
}

/// Writes records to shard streams.
pub(crate) struct Publisher {
    stream: StreamName,
    /// The lanes to one server (empty on a cluster).
    lanes: Vec<Lane>,
    /// The per-node lanes and slot map, on a cluster.
    cluster: Option<Box<cluster::ClusterRoute>>,
    trim: Option<Trim>,
    /// The fenced publish script, when on (else plain `XADD` pipelines).
    scripted: Option<Scripted>,
    /// The `WAIT` behind every write, when durable ([`durable`]).
    durable: Option<Durable>,
    /// Round-robin position for records without a key.
    round_robin: AtomicU64,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("stream", &self.stream)
            .field("lanes", &self.lanes.len())
            .field("cluster", &self.cluster.is_some())
            .field("trim", &self.trim)
            .field("scripted", &self.scripted.is_some())
            .field(
                "producer_id",
                &self
                    .scripted
                    .as_ref()
                    .and_then(|s| s.idempotence.as_ref())
                    .map(|i| &i.producer_id),
            )
            .finish_non_exhaustive()
    }
}

impl Publisher {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        stream: StreamName,
        client: redis::Client,
        redis_url: &str,
        connections: usize,
        connect_timeout: Duration,
        response_timeout: Duration,
        trim: Option<Trim>,
        stats: Arc<Stats>,
    ) -> Self {
        let timeouts = LaneTimeouts {
            connect: connect_timeout,
            response: response_timeout,
        };
        let gate = Arc::new(RedisGate::new(redis_url.to_owned(), None));
        let lanes = (0..connections)
            .map(|_| Lane::new(gate.clone(), client.clone(), timeouts, false))
            .collect();
        Publisher {
            stream,
            lanes,
            cluster: None,
            trim,
            scripted: None,
            durable: None,
            round_robin: AtomicU64::new(0),
            stats,
        }
    }

    /// A publisher for the Redis Cluster these seed URLs reach (see "Redis Cluster" in the module docs).
    ///
    /// # Errors
    /// A seed that is not a TCP `redis://` / `rediss://` URL.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn cluster(
        stream: StreamName,
        seeds: &[String],
        connections: usize,
        connect_timeout: Duration,
        response_timeout: Duration,
        trim: Option<Trim>,
        stats: Arc<Stats>,
    ) -> Result<Self, RedisError> {
        let timeouts = LaneTimeouts {
            connect: connect_timeout,
            response: response_timeout,
        };
        let route = cluster::ClusterRoute::new(seeds, timeouts, connections)?;
        Ok(Publisher {
            stream,
            lanes: Vec::new(),
            cluster: Some(Box::new(route)),
            trim,
            scripted: None,
            durable: None,
            round_robin: AtomicU64::new(0),
            stats,
        })
    }

    /// Publishes through the fenced publish script from now on, idempotently when `idempotence` is given.
    pub(crate) fn scripted(mut self, idempotence: Option<IdempotenceConfig>) -> Self {
        // On one server only the idempotent producer sends the script; the fenced one checks transactions.
        for lane in &mut self.lanes {
            lane.preload_script = idempotence.is_some();
        }
        if let Some(cluster) = &mut self.cluster {
            cluster.preload_script = true;
        }
        self.scripted = Some(Scripted {
            script: PublishScript::default(),
            idempotence: idempotence.map(Idempotence::new),
        });
        self
    }

    /// The idempotent producer's id, when idempotent.
    pub(crate) fn producer_id(&self) -> Option<&str> {
        self.scripted
            .as_ref()
            .and_then(|s| s.idempotence.as_ref())
            .map(|i| i.producer_id.as_str())
    }

    /// Opens every lane's connection now.
    ///
    /// # Errors
    /// The first connection error.
    pub(crate) async fn connect_all(&self) -> Result<(), ConnectFailure> {
        if let Some(cluster) = &self.cluster {
            return cluster.connect_all().await;
        }
        for lane in &self.lanes {
            lane.connection().await?;
        }
        Ok(())
    }

    /// Chooses the shard of every record: by key, or round-robin for keyless records.
    fn shards_of<R: std::borrow::Borrow<Record>>(&self, records: &[R], shard_count: u32) -> Vec<ShardId> {
        let count = shard_count.max(1);
        let keyless = records.iter().filter(|r| r.borrow().key.is_none()).count() as u64;
        let mut next = if keyless > 0 {
            self.round_robin.fetch_add(keyless, Ordering::Relaxed)
        } else {
            0
        };
        records
            .iter()
            .map(|r| match &r.borrow().key {
                Some(key) => shard_for_key(key, count),
                None => {
                    let shard = ShardId((next % u64::from(count)) as u32);
                    next = next.wrapping_add(1);
                    shard
                }
            })
            .collect()
    }

    fn add_xadd(&self, pipe: &mut redis::Pipeline, key: &str, record: &Record, minid: Option<&str>) {
        pipe.add_command(self.xadd(key, record, minid));
    }

    /// How many arguments the `XADD` of `record` has (the command name counts).
    fn xadd_arg_count(&self, record: &Record) -> usize {
        let trim = if self.trim.is_some() { 3 } else { 0 };
        3 + trim + 2 * record.fields.len()
    }

    /// The arguments of the `XADD` of one record (with the producer's trimming), in order: the one definition
    /// of the command, written as a redis-rs `Cmd` ([`Publisher::xadd`]) or as RESP ([`Publisher::encode_xadds`]).
    fn xadd_args(&self, key: &str, record: &Record, minid: Option<&str>, mut arg: impl FnMut(&[u8])) {
        arg(b"XADD");
        arg(key.as_bytes());
        match self.trim {
            Some(Trim::MaxLen(n)) => {
                arg(b"MAXLEN");
                arg(b"~");
                arg(resp::Decimal::new(n).as_bytes());
            }
            Some(Trim::MaxAge(_)) => {
                arg(b"MINID");
                arg(b"~");
                arg(minid.unwrap_or("0").as_bytes());
            }
            None => {}
        }
        arg(b"*");
        for (name, value) in &record.fields {
            arg(name);
            arg(value);
        }
    }

    /// The `XADD` of one record as a redis-rs command (the cluster path, which re-sends commands one by one).
    fn xadd(&self, key: &str, record: &Record, minid: Option<&str>) -> redis::Cmd {
        // Sized up front: a command that grows while its arguments are added reallocates two buffers several
        // times per record.
        let field_bytes: usize = record.fields.iter().map(|(n, v)| n.len() + v.len()).sum();
        let mut cmd = redis::Cmd::with_capacity(self.xadd_arg_count(record), 64 + key.len() + field_bytes);
        self.xadd_args(key, record, minid, |a| {
            cmd.arg(a);
        });
        cmd
    }

    /// The `XADD`s of `records` to `key`, as RESP in one buffer.
    fn encode_xadds<'r>(
        &self,
        key: &str,
        records: impl Iterator<Item = &'r Record> + Clone,
        minid: Option<&str>,
    ) -> bytes::Bytes {
        // Sized up front (an estimate that is exact for short arguments): one allocation per pipeline.
        let per_arg = resp::arg_len(0) + 2;
        let fixed = resp::arg_len(key.len()) + 6 * per_arg + 40 + minid.map_or(0, str::len);
        let size: usize = records
            .clone()
            .map(|r| {
                let fields: usize = r.fields.iter().map(|(n, v)| n.len() + v.len() + 2 * per_arg).sum();
                fixed + fields
            })
            .sum();
        let mut buf = Vec::with_capacity(size);
        for record in records {
            resp::write_command(&mut buf, self.xadd_arg_count(record));
            self.xadd_args(key, record, minid, |a| resp::write_arg(&mut buf, a));
        }
        buf.into()
    }

    fn minid(&self) -> Option<String> {
        match self.trim {
            Some(Trim::MaxAge(age)) => {
                // Entry ids are Redis's wall-clock milliseconds; the producer's clock is close enough for an
                // approximate retention bound.
                let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
                Some(format!("{}-0", now.saturating_sub(age).as_millis()))
            }
            _ => None,
        }
    }

    /// Publishes `records` with `routing`, one pipeline per shard, the shards' pipelines concurrently. Returns
    /// one result per record, in input order. Records must have been checked ([`Record::check`]).
    ///
    /// # Cancel safety
    /// Not cancel safe in the sense of outcomes: dropping the future after pipelines left leaves their records in
    /// an unknown state (they may be written).
    pub(crate) async fn publish<R: std::borrow::Borrow<Record>>(
        &self,
        records: &[R],
        routing: RoutingInfo,
    ) -> Vec<Result<Published, PublishError>> {
        let shards = self.shards_of(records, routing.shard_count);
        // The records of each shard, in input order: one stable sort instead of a map of vectors. The groups come
        // out in shard order, which is also the deterministic issue order (per lane the pipelines are written in
        // this order).
        let mut order: Vec<usize> = (0..records.len()).collect();
        order.sort_by_key(|&i| shards[i]);
        let groups: Vec<(ShardId, &[usize])> = order
            .chunk_by(|&a, &b| shards[a] == shards[b])
            .map(|indices| (shards[indices[0]], indices))
            .collect();
        let minid = self.minid();
        let minid = minid.as_deref();
        let presented = Presented {
            version: routing.version,
            records: routing.shard_records,
            count: routing.shard_count,
        };
        let pipelines = groups.iter().map(|&(shard, indices)| async move {
            if let Some(scripted) = &self.scripted {
                let shard_records: Vec<&Record> = indices.iter().map(|&i| records[i].borrow()).collect();
                if scripted.idempotence.is_none() && self.cluster.is_none() {
                    return self.run_transactions(shard, &shard_records, presented, minid).await;
                }
                return self
                    .run_scripted(scripted, shard, &shard_records, presented, minid)
                    .await;
            }
            let key = keys::shard_stream(&self.stream, shard);
            let (outcomes, replication) = if self.cluster.is_some() {
                let mut pipe = redis::Pipeline::with_capacity(indices.len());
                pipe.ignore_errors();
                for &i in indices {
                    self.add_xadd(&mut pipe, &key, records[i].borrow(), minid);
                }
                self.send(shard, &pipe).await
            } else {
                let commands = self.encode_xadds(&key, indices.iter().map(|&i| records[i].borrow()), minid);
                self.send_packed(shard, commands, indices.len()).await
            };
            self.settle_shard(shard, outcomes, indices.len(), routing.version, &replication)
        });
        let results = futures::future::join_all(pipelines).await;
        let mut out: Vec<Option<Result<Published, PublishError>>> = vec![None; records.len()];
        for ((_, indices), shard_results) in groups.into_iter().zip(results) {
            for (&i, r) in indices.iter().zip(shard_results) {
                out[i] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| r.expect("every record belongs to exactly one shard group"))
            .collect()
    }

    /// Sends one shard's pipeline: to its lane, or on a cluster to the master of its slot (following redirects).
    /// One outcome per command, except when a single server answered with another number of replies; and, when
    /// durable, what the `WAIT` behind it confirmed.
    async fn send(&self, shard: ShardId, pipe: &redis::Pipeline) -> (Vec<CmdOutcome>, Replication) {
        self.stats.pipelines.fetch_add(1, Ordering::Relaxed);
        let _in_flight = InFlightGuard::enter(&self.stats.pipelines_in_flight);
        if let Some(cluster) = &self.cluster {
            return cluster
                .run(&self.stats, &self.stream, shard, pipe, self.durable.as_ref())
                .await;
        }
        let lane = &self.lanes[shard.index() % self.lanes.len()];
        self.run_on_lane(lane, pipe).await
    }

    /// Sends `count` RESP-encoded commands of one shard to its lane (one server only), and `WAIT` when durable.
    async fn send_packed(
        &self,
        shard: ShardId,
        commands: bytes::Bytes,
        count: usize,
    ) -> (Vec<CmdOutcome>, Replication) {
        self.stats.pipelines.fetch_add(1, Ordering::Relaxed);
        let _in_flight = InFlightGuard::enter(&self.stats.pipelines_in_flight);
        let lane = &self.lanes[shard.index() % self.lanes.len()];
        self.run_packed_on_lane(lane, commands, count).await
    }

    /// The results of a shard's `count` `XADD`s from their outcomes.
    fn settle_shard(
        &self,
        shard: ShardId,
        outcomes: Vec<CmdOutcome>,
        count: usize,
        routing_version: RoutingVersion,
        replication: &Replication,
    ) -> Vec<Result<Published, PublishError>> {
        let results: Vec<Result<Published, PublishError>> = if outcomes.len() == count {
            outcomes
                .into_iter()
                .map(|outcome| match outcome {
                    CmdOutcome::Reply(reply) => xadd_outcome(shard, routing_version, reply),
                    CmdOutcome::Connect(f) => Err(f.into_publish_error(shard)),
                    CmdOutcome::Lost(source) => Err(PublishError::ConnectionLost { shard, source }),
                    CmdOutcome::Unsettled(reason, source) => {
                        Err(PublishError::ClusterUnsettled { shard, reason, source })
                    }
                    CmdOutcome::Unexpected(detail) => Err(PublishError::UnexpectedReply { shard, detail }),
                })
                .collect()
        } else {
            let err = PublishError::UnexpectedReply {
                shard,
                detail: format!("{} replies to {count} XADDs", outcomes.len()),
            };
            vec![Err(err); count]
        };
        let results = replication.apply(results);
        self.count(&results);
        results
    }

    /// Publishes one shard's records through the script: split into calls of at most [`MAX_RECORDS_PER_CALL`]
    /// records, all in one pipeline, or one call at a time under the shard's sequence lock when idempotent.
    async fn run_scripted(
        &self,
        scripted: &Scripted,
        shard: ShardId,
        records: &[&Record],
        presented: Presented,
        minid: Option<&str>,
    ) -> Vec<Result<Published, PublishError>> {
        let routing_version = presented.version;
        let mut out: Vec<Option<Result<Published, PublishError>>> = vec![None; records.len()];
        let mut calls: Vec<Vec<usize>> = Vec::new();
        let mut args = 0;
        for (i, r) in records.iter().enumerate() {
            if r.fields().len() > MAX_FIELDS_PER_RECORD {
                out[i] = Some(Err(PublishError::InvalidRecord(
                    "a record published through the fenced script has at most 1000 fields",
                )));
                continue;
            }
            let full = calls
                .last()
                .is_none_or(|c| c.len() >= MAX_RECORDS_PER_CALL || args + args_of(r) > MAX_ARGS_PER_CALL);
            if full {
                calls.push(Vec::new());
                args = 0;
            }
            args += args_of(r);
            calls.last_mut().expect("pushed above").push(i);
        }
        let trim = match (self.trim, minid) {
            (Some(Trim::MaxLen(n)), _) => ScriptTrim::MaxLen(n),
            (Some(Trim::MaxAge(_)), Some(id)) => ScriptTrim::MinId(id),
            _ => ScriptTrim::None,
        };
        let call_records: Vec<Vec<&Record>> = calls.iter().map(|c| c.iter().map(|&i| records[i]).collect()).collect();
        match &scripted.idempotence {
            None => {
                let specs: Vec<CallSpec<'_>> = call_records
                    .iter()
                    .map(|r| CallSpec {
                        records: r,
                        sequence: None,
                    })
                    .collect();
                let outcomes = self.calls(scripted, shard, presented, trim, &specs).await;
                for ((indices, (outcome, replication)), spec) in calls.iter().zip(outcomes).zip(&specs) {
                    let results = replication.apply(self.results(shard, routing_version, spec, outcome));
                    for (&i, r) in indices.iter().zip(results) {
                        out[i] = Some(r);
                    }
                }
            }
            Some(idem) => {
                let lock = idem.shard(shard);
                let mut sequence = lock.lock().await;
                for (indices, recs) in calls.iter().zip(&call_records) {
                    let results = self
                        .call_idempotent(scripted, idem, &mut sequence, shard, presented, trim, recs)
                        .await;
                    for (&i, r) in indices.iter().zip(results) {
                        out[i] = Some(r);
                    }
                }
            }
        }
        let results: Vec<Result<Published, PublishError>> = out
            .into_iter()
            .map(|r| r.expect("every record is in one call or refused"))
            .collect();
        self.count(&results);
        results
    }

    /// One idempotent call, retried with the same sequence numbers while its outcome is unknown.
    #[allow(clippy::too_many_arguments)]
    async fn call_idempotent(
        &self,
        scripted: &Scripted,
        idem: &Idempotence,
        sequence: &mut ShardSequence,
        shard: ShardId,
        presented: Presented,
        trim: ScriptTrim<'_>,
        records: &[&Record],
    ) -> Vec<Result<Published, PublishError>> {
        let routing_version = presented.version;
        let first = sequence.next;
        let count = records.len() as u64;
        // Set once an attempt may have been executed: from then on only the script's answer settles the call.
        let mut lost: Option<Arc<RedisError>> = None;
        let mut attempt = 0u32;
        loop {
            let spec = CallSpec {
                records,
                sequence: Some(Sequence {
                    producer_id: &idem.producer_id,
                    epoch: &idem.epoch,
                    first,
                    gap: sequence.gap,
                    idle_ms: idem.idle_ms,
                }),
            };
            let (outcome, replication) = self
                .calls(scripted, shard, presented, trim, std::slice::from_ref(&spec))
                .await
                .pop()
                .expect("one outcome per call");
            let retry = match &outcome {
                CallOutcome::Reply(ScriptReply::Written(_) | ScriptReply::Duplicate(_)) => {
                    sequence.next = first + count;
                    sequence.gap = false;
                    false
                }
                // The duplicate check comes before the fence in the script: a fenced call was not written by any
                // attempt, and its numbers are left for the next call.
                CallOutcome::Reply(ScriptReply::Fenced(_)) => false,
                // The shard lost our last calls (a failover): nothing of this call is there; resume with a gap.
                CallOutcome::Reply(ScriptReply::OutOfOrder { .. }) if !sequence.gap => {
                    sequence.gap = true;
                    true
                }
                CallOutcome::Reply(ScriptReply::OutOfOrder { .. }) => false,
                CallOutcome::Reply(ScriptReply::OutOfWindow { next }) => {
                    sequence.next = (*next).max(first + count);
                    sequence.gap = true;
                    false
                }
                CallOutcome::Lost(e) => {
                    lost.get_or_insert_with(|| e.clone());
                    true
                }
                CallOutcome::Connect(_) | CallOutcome::Rejected(_) | CallOutcome::Unsettled(..) => lost.is_some(),
                CallOutcome::Unexpected(_) => {
                    sequence.next = first + count;
                    sequence.gap = true;
                    false
                }
            };
            if retry && attempt < idem.max_retries {
                attempt += 1;
                let backoff = Duration::from_millis(10u64 << attempt.min(6)).min(IDEMPOTENT_RETRY_MAX);
                tokio::time::sleep(backoff).await;
                continue;
            }
            if let Some(source) = lost.filter(|_| retry) {
                // Every retry failed to settle the call: it may be written. Skip its numbers.
                sequence.next = first + count;
                sequence.gap = true;
                return vec![Err(PublishError::ConnectionLost { shard, source }); records.len()];
            }
            return replication.apply(self.results(shard, routing_version, &spec, outcome));
        }
    }

    /// Runs script calls of one shard in one pipeline. Calls answered `NOSCRIPT` (a restarted or failed-over
    /// Redis: nothing executed) are sent again once, after `SCRIPT LOAD`. With each outcome, what the `WAIT`
    /// behind the call's pipeline confirmed (durable producer).
    async fn calls(
        &self,
        scripted: &Scripted,
        shard: ShardId,
        presented: Presented,
        trim: ScriptTrim<'_>,
        specs: &[CallSpec<'_>],
    ) -> Vec<(CallOutcome, Replication)> {
        let mut outcomes: Vec<Option<(CallOutcome, Replication)>> = (0..specs.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..specs.len()).collect();
        for load in [false, true] {
            if pending.is_empty() {
                break;
            }
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            if load {
                scripted.script.add_load(&mut pipe);
            }
            for &c in &pending {
                let spec = &specs[c];
                scripted.script.add_call(
                    &mut pipe,
                    &self.stream,
                    shard,
                    presented,
                    trim,
                    spec.sequence,
                    spec.records.iter().copied(),
                );
            }
            let (mut replies, replication) = self.send(shard, &pipe).await;
            if load && !replies.is_empty() {
                // A failed load shows as NOSCRIPT again in the calls behind it.
                let _load = replies.remove(0);
            }
            if replies.len() != pending.len() {
                for &c in &pending {
                    let detail = format!("{} replies to {} script calls", replies.len(), pending.len());
                    outcomes[c] = Some((CallOutcome::Unexpected(detail), replication.clone()));
                }
                break;
            }
            let mut again = Vec::new();
            for (c, reply) in pending.iter().copied().zip(replies) {
                let outcome = match reply {
                    CmdOutcome::Reply(Err(e))
                        if !load && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        again.push(c);
                        continue;
                    }
                    CmdOutcome::Reply(Err(e)) => CallOutcome::Rejected(Arc::new(e)),
                    CmdOutcome::Reply(Ok(value)) => match parse_reply(value, specs[c].records.len()) {
                        Some(reply) => CallOutcome::Reply(reply),
                        None => CallOutcome::Unexpected("not an answer of the publish script".into()),
                    },
                    CmdOutcome::Connect(f) => CallOutcome::Connect(f),
                    CmdOutcome::Lost(e) => CallOutcome::Lost(e),
                    CmdOutcome::Unsettled(reason, e) => CallOutcome::Unsettled(reason, e),
                    CmdOutcome::Unexpected(detail) => CallOutcome::Unexpected(detail),
                };
                outcomes[c] = Some((outcome, replication.clone()));
            }
            pending = again;
        }
        outcomes
            .into_iter()
            .map(|o| o.expect("every call has an outcome"))
            .collect()
    }

    /// One result per record of a call.
    fn results(
        &self,
        shard: ShardId,
        routing_version: RoutingVersion,
        spec: &CallSpec<'_>,
        outcome: CallOutcome,
    ) -> Vec<Result<Published, PublishError>> {
        let n = spec.records.len();
        let sequence = spec.sequence.map_or(0, |s| s.first);
        let err = match outcome {
            CallOutcome::Reply(ScriptReply::Written(ids)) => return published(shard, routing_version, ids, false),
            CallOutcome::Reply(ScriptReply::Duplicate(ids)) => return published(shard, routing_version, ids, true),
            CallOutcome::Reply(ScriptReply::Fenced(fence)) => PublishError::Fenced {
                shard,
                routing_version,
                fence,
            },
            CallOutcome::Reply(ScriptReply::OutOfOrder { expected }) => PublishError::OutOfOrderSequence {
                shard,
                sequence,
                expected,
            },
            CallOutcome::Reply(ScriptReply::OutOfWindow { next }) => {
                PublishError::SequenceOutOfWindow { shard, sequence, next }
            }
            CallOutcome::Rejected(source) => PublishError::Rejected { shard, source },
            CallOutcome::Connect(f) => f.into_publish_error(shard),
            CallOutcome::Lost(source) => PublishError::ConnectionLost { shard, source },
            CallOutcome::Unsettled(reason, source) => PublishError::ClusterUnsettled { shard, reason, source },
            CallOutcome::Unexpected(detail) => PublishError::UnexpectedReply { shard, detail },
        };
        vec![Err(err); n]
    }

    fn count(&self, results: &[Result<Published, PublishError>]) {
        let (mut written, mut not_written, mut unknown) = (0u64, 0u64, 0u64);
        let mut not_replicated = 0u64;
        for r in results {
            match r {
                Ok(_) => written += 1,
                Err(e) if e.write_state() == crate::WriteState::Unknown => {
                    unknown += 1;
                    not_replicated += u64::from(e.is_not_replicated());
                }
                Err(_) => not_written += 1,
            }
        }
        let s = &self.stats;
        s.records_not_replicated.fetch_add(not_replicated, Ordering::Relaxed);
        s.records_written.fetch_add(written, Ordering::Relaxed);
        s.records_not_written.fetch_add(not_written, Ordering::Relaxed);
        s.records_unknown.fetch_add(unknown, Ordering::Relaxed);
        s.metrics.records(written, not_written, unknown);
    }
}

/// One command's reply as redis-rs's pipelines give it: an error reply is `Err`; errors nested in an array (the
/// `XADD`s inside `EXEC`'s answer, each of which ran or not on its own) stay values.
pub(crate) fn reply_of(value: Value) -> redis::RedisResult<Value> {
    match value {
        Value::ServerError(e) => Err(e.into()),
        other => Ok(other),
    }
}

/// One outcome per command of a lane's pipeline of `count` commands.
fn cmd_outcomes(run: Result<Vec<redis::RedisResult<Value>>, LaneError>, count: usize) -> Vec<CmdOutcome> {
    match run {
        Ok(replies) => replies.into_iter().map(CmdOutcome::Reply).collect(),
        Err(LaneError::Connect(f)) => (0..count).map(|_| CmdOutcome::Connect(f.clone())).collect(),
        Err(LaneError::Lost(e)) => {
            let e = Arc::new(e);
            (0..count).map(|_| CmdOutcome::Lost(e.clone())).collect()
        }
    }
}

/// The outcome of one `XADD` from its reply: an entry id, or Redis's refusal (a top-level error reply, or an
/// error inside `EXEC`'s answer).
pub(crate) fn xadd_outcome(
    shard: ShardId,
    routing_version: RoutingVersion,
    reply: redis::RedisResult<Value>,
) -> Result<Published, PublishError> {
    let rejected = |e: RedisError| PublishError::Rejected {
        shard,
        source: Arc::new(e),
    };
    match reply {
        Err(e) => Err(rejected(e)),
        Ok(Value::ServerError(e)) => Err(rejected(e.into())),
        Ok(value) => publish_script::entry_id(&value)
            .map(|id| Published {
                shard,
                id,
                routing_version,
                duplicate: false,
            })
            .ok_or_else(|| PublishError::UnexpectedReply {
                shard,
                detail: "the reply is not an entry id".into(),
            }),
    }
}

fn published(
    shard: ShardId,
    routing_version: RoutingVersion,
    ids: Vec<EntryId>,
    duplicate: bool,
) -> Vec<Result<Published, PublishError>> {
    ids.into_iter()
        .map(|id| {
            Ok(Published {
                shard,
                id,
                routing_version,
                duplicate,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publisher() -> Publisher {
        Publisher::new(
            StreamName::new("orders").unwrap(),
            redis::Client::open("redis://127.0.0.1:1").unwrap(),
            "redis://127.0.0.1:1",
            2,
            Duration::from_secs(1),
            Duration::from_secs(1),
            Some(Trim::MaxLen(1000)),
            Arc::default(),
        )
    }

    #[test]
    fn keyed_records_follow_shard_for_key() {
        let p = publisher();
        let records: Vec<Record> = (0..100)
            .map(|i| Record::with_key(format!("k{i}")).field("f", "v"))
            .collect();
        let shards = p.shards_of(&records, 7);
        for (r, s) in records.iter().zip(shards) {
            assert_eq!(s, shard_for_key(r.key().unwrap(), 7));
        }
    }

    #[test]
    fn keyless_records_go_round_robin_across_calls() {
        let p = publisher();
        let records: Vec<Record> = (0..5).map(|_| Record::without_key().field("f", "v")).collect();
        let first = p.shards_of(&records, 4);
        let second = p.shards_of(&records, 4);
        let all: Vec<u32> = first.iter().chain(&second).map(|s| s.0).collect();
        assert_eq!(all, vec![0, 1, 2, 3, 0, 1, 2, 3, 0, 1]);
    }

    #[test]
    fn xadd_carries_approximate_maxlen() {
        let p = publisher();
        let mut pipe = redis::pipe();
        p.add_xadd(&mut pipe, "k", &Record::with_key("a").field("f", "v"), None);
        let packed = String::from_utf8_lossy(&pipe.get_packed_pipeline()).to_string();
        let words: Vec<&str> = packed
            .split("\r\n")
            .filter(|w| !(w.starts_with('$') || (w.starts_with('*') && w.len() > 1)))
            .collect();
        assert_eq!(words, ["XADD", "k", "MAXLEN", "~", "1000", "*", "f", "v", ""]);
    }

    #[test]
    fn the_resp_written_xadds_are_the_commands_redis_rs_would_send() {
        let records = [
            Record::with_key("a").field("f", "v"),
            Record::without_key()
                .field("", "")
                .field(vec![0u8, 13, 10], "x".repeat(300)),
        ];
        for trim in [
            None,
            Some(Trim::MaxLen(1000)),
            Some(Trim::MaxAge(Duration::from_secs(60))),
        ] {
            let mut p = publisher();
            p.trim = trim;
            let minid = p.minid();
            let mut pipe = redis::pipe();
            for r in &records {
                p.add_xadd(&mut pipe, "s:{orders}:3", r, minid.as_deref());
            }
            let encoded = p.encode_xadds("s:{orders}:3", records.iter(), minid.as_deref());
            assert_eq!(&encoded[..], &pipe.get_packed_pipeline()[..], "{trim:?}");
        }
    }

    #[test]
    fn records_need_a_field() {
        assert!(Record::with_key("a").check().is_err());
        assert!(Record::with_key("a").field("f", "").check().is_ok());
    }
}

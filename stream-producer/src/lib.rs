//! The producer SDK of redis-stream-coord: publishes records to a sharded Redis Stream, routing each record to a
//! shard with the stream's current shard count, which it learns from the coordinator.
//!
//! A producer does not heartbeat. Its only channel to the coordinator is the *routing refresh*, so the routing it
//! caches carries a lease: used while the lease holds, refreshed well before it ends, and never used after it
//! ended. A producer that cannot reach any coordinator keeps publishing until its lease runs out, then fails
//! closed ([`PublishError::RoutingExpired`]) and writes nothing, rather than route with a shard count that may
//! be stale.
//!
//! # Example
//! ```no_run
//! use stream_producer::{Producer, Record};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let producer = Producer::builder("orders")
//!     .coordinator("http://127.0.0.1:7400")
//!     .redis("redis://127.0.0.1:6379")
//!     .build()?;
//!
//! // One record, routed by its key.
//! let p = producer.send("customer-42", &[("type", "order-created"), ("amount", "12.50")]).await?;
//! println!("written to shard {} as {}", p.shard, p.id);
//!
//! // A batch: one pipeline per shard.
//! let batch = (0..100)
//!     .map(|i| Record::with_key(format!("customer-{i}")).field("amount", format!("{i}.00")))
//!     .collect();
//! producer.send_batch(batch).await?;
//!
//! // The batching mode: accepted now, written with others.
//! let delivery = producer.enqueue(Record::without_key().field("amount", "0.10")).await?;
//! delivery.await?;
//!
//! // Publish what is queued, stop the tasks.
//! let stats = producer.close().await?;
//! println!("{} records written", stats.records_written);
//! # Ok(()) }
//! ```
//!
//! # Publishing
//! * [`Producer::send`] / [`Producer::send_record`]: one record, one answer (shard and entry id).
//! * [`Producer::send_batch`]: many records, one pipeline per shard, one answer per record.
//! * [`Producer::enqueue`] + [`Delivery`]: the batching mode, for many concurrent callers; [`Producer::flush`]
//!   and [`Producer::close`] wait for every accepted record's outcome.
//!
//! Each shard batch is written fenced: as a transaction whose `WATCH`ed check of the shard's fence comes first (one
//! server), or as one call of the publish script (idempotent producer, Redis Cluster). Either writes the whole batch
//! or nothing and refuses a producer whose routing version is below the shard's fence (set when the stream grows)
//! with [`PublishError::Fenced`]; see [`ProducerBuilder::reroute_fenced`] and the idempotent producer
//! ([`ProducerBuilder::idempotence`]), and [`docs/producer.md`]. Which of the two (or plain `XADD`s, with fencing off)
//! is chosen once, when the producer is built.
//!
//! Records with a key go to `shard_for_key(key, shard_count)`; records without a key go round-robin. Every
//! failure says whether the record was written, not written, or may have been ([`WriteState`]), so a caller
//! knows when retrying is safe.
//!
//! Written means the Redis master executed the write, by default. With
//! [`durability(Durability::Replicas { min, timeout })`](ProducerBuilder::durability) it also means that at least
//! `min` replicas confirmed it (`WAIT`, pipelined behind the write); records they do not confirm in time are
//! [`PublishError::NotReplicated`], Unknown.
//!
//! # Outcomes: what to do when a publish fails
//! Every [`PublishError`] says whether the record is in its shard stream ([`PublishError::write_state`]):
//! * [`WriteState::NotWritten`]: sending it again cannot duplicate it. Among these, [`PublishError::Fenced`] is
//!   the one seen right after the stream grew (`coordctl add-shards`): the producer routed with the old shard
//!   count, the shard's fence refused the batch, and the producer has already fetched the new routing, so sending
//!   again places the record right. By default ([`ProducerBuilder::reroute_fenced`]) the producer does it inside
//!   the call, so a caller sees `Fenced` only when the coordinator did not serve the new routing in time.
//!   [`PublishError::RoutingExpired`] means no coordinator answered for longer than the routing lease.
//! * [`WriteState::Unknown`]: the request left and its answer was lost ([`PublishError::ConnectionLost`]);
//!   sending again may duplicate it, unless the producer is idempotent ([`ProducerBuilder::idempotence`]).
//!
//! [`PublishError::is_retryable`] says whether sending again later can succeed. A batch answers one
//! [`RecordOutcome`] per record ([`BatchError::indices`] finds those safe to send again). The table of every error
//! with what to do is in the crate's README ([`stream-producer/README.md`], "Outcomes").
//!
//! # Routing rules
//! The cache follows the failure-handling design's producer rules; each is a test in `routing_cache`:
//! 1. The lease starts at the monotonic send time of the refresh that returned it and lasts `routingLeaseMs`.
//! 2. A refresh runs at `refreshIntervalMs` (a third of the lease) after that, even while publishes succeed.
//! 3. Knowing a newer routing version exists ([`Producer::observe_routing_version`]) refreshes at once, and
//!    publishes wait for that refresh. Publishes that find the lease ended refresh first too. Concurrent
//!    publishes share one refresh.
//! 4. The cache is replaced only by a newer routing version, except when the coordinator answers
//!    `SYNC_METADATA` (the producer reported a version above what Redis stores, e.g. after a Redis rollback):
//!    then the stored routing is adopted and counted ([`ProducerStats::routing_rollbacks`]).
//! 5. A failed refresh keeps the cache while its lease holds; once the lease has ended and refresh still fails,
//!    every publish fails with [`PublishError::RoutingExpired`] and nothing is written.
//! 6. Every refresh carries the routing version in use and the highest one ever observed (kept by the
//!    [`VersionStore`], key: the stream name). Several coordinator URLs may be given; a connection error or
//!    `503 COORDINATOR_TERMINATING` moves to the next at once.
//!
//! # Optional features
//! * `metrics` (default): records the producer's metrics (routing cache age, routing lease remaining, refresh
//!   failures, rollbacks, refused publishes, record outcomes) through the [`metrics`](https://docs.rs/metrics/0.24)
//!   facade. The application installs the recorder (the exporter of its choice) *before* building the producer.
//!   Names and update points: [`metrics`]. Disable it with `default-features = false`; the [`metrics::names`]
//!   constants stay available.
//!
//! # Layout
//! How the crate is built inside (none of these modules needs to be known to use it):
//! * `routing_cache`: the pure routing cache: entries, the lease (from the *send* time of the refresh that
//!   returned it), and the "refresh now?", "replace?" and "refuse?" decisions. No clock, no I/O.
//! * `refresher`: fetches routing from the coordinator (single flight; the background schedule and the publish
//!   path share one in-flight request) and persists the highest observed version through the
//!   [`VersionStore`] SPI.
//! * `record`: [`Record`], what a caller publishes (the lowest module of the publish path).
//! * `publisher`: routes records ([`protocol::routing::shard_for_key`], round-robin without a key), hands each
//!   shard's records to the write path, and counts every outcome. It does not know which path it drives.
//! * `write_path`: how one shard's records are written, one type per path, one file each, chosen once when the
//!   producer is built: `fenced` (the checked transaction, one server), `scripted` (the publish script: the
//!   idempotent producer, and fencing on a Redis Cluster), `plain` (pipelined `XADD`s written as RESP, fencing
//!   off) and `cluster_pipeline` (pipelined `XADD`s on a Redis Cluster, fencing off); `xadd` (the `XADD` with the
//!   producer's trimming) and `idempotence` (the idempotent producer's sequences) are what they share.
//! * `lanes`: the pipelining connections the paths send on ([`redis_link::PipelinedConnection`]): one server's
//!   lanes (`server`), a cluster's per-node lanes and redirects (`cluster`), the Redis check of each server
//!   (`gate`), and durable writes ([`Durability::Replicas`]: the `WAIT` behind every write request, `durable`).
//! * `publish_script`: the fenced (and optionally idempotent) publish script and its arguments and answers.
//! * `fence`: the one rule that decides whether a shard takes a fenced write.
//! * `batcher`: the background batching mode (the accumulator callers append to, linger, batch size, backpressure, flush,
//!   the outcome a batch shares with its deliveries).
//! * `routed_publisher`: the publisher with its routing, what the handle and the batcher share: a routing valid now,
//!   the publish, and the re-routing of records a fence refused.
//! * [`producer`]: the [`Producer`] handle, which owns the tasks (cancellation token + task tracker) and starts
//!   them on first use.
//! * `builder`: [`ProducerBuilder`] and [`Producer::builder`]. `build()` is inert, like the consumer's: it
//!   checks the settings, spawns nothing and works outside a tokio runtime.
//! * [`config`]: [`ProducerConfig`], [`Trim`], [`BatchingConfig`]; validation.
//! * `published`: [`Published`], where a record was written.
//! * [`error`]: [`ConfigError`], [`PublishError`] with [`WriteState`], [`BatchError`], [`RefreshError`],
//!   [`ProducerError`]. [`CoordError`], [`RedisCheckError`] and [`RedisFailure`] (the Redis client's error,
//!   wrapped; [`HttpFailure`] is the HTTP client's), which they carry, are re-exported.
//! * [`stats`]: the counters and routing state callers read ([`ProducerStats`]).
//! * [`metrics`]: metric names, labels, and where each is updated.
//!
//! [`docs/producer.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/producer.md
//! [`stream-producer/README.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/stream-producer/README.md
#![warn(missing_docs)]

mod batcher;
mod builder;
pub mod config;
pub mod error;
mod fence;
mod lanes;
pub mod metrics;
pub mod producer;
mod publish_script;
mod published;
mod publisher;
mod record;
mod refresher;
mod routed_publisher;
mod routing_cache;
pub mod stats;
mod write_path;

pub use batcher::Delivery;
pub use builder::ProducerBuilder;
pub use client_core::{
    CoordError, FileVersionStore, HttpErrorKind, HttpFailure, MemoryVersionStore, RedisCheckError, RedisErrorKind,
    RedisFailure, RedisRequirements, VersionStore, VersionStoreError,
};
pub use config::{BatchingConfig, Durability, IdempotenceConfig, ProducerConfig, Trim};
pub use error::{BatchError, ConfigError, ProducerError, PublishError, RecordOutcome, RefreshError, WriteState};
pub use lanes::REDIS_REQUIREMENTS;
pub use producer::Producer;
pub use protocol::{EntryId, RoutingVersion, ShardId};
pub use published::Published;
pub use record::Record;
pub use routing_cache::RoutingInfo;
pub use stats::ProducerStats;

/// The publish script's source. Not part of the API: for the Redis Cluster slot test (issue 15), which runs the
/// script through a cluster connection.
#[cfg(feature = "test-util")]
#[doc(hidden)]
pub fn publish_script_source() -> &'static str {
    publish_script::PublishScript::source()
}

/// One publish-script call (`EVALSHA` of [`publish_script_source`] with the shard's keys and the arguments) exactly
/// as the producer pipelines it, without trimming; idempotent when `sequence` is `Some((producer id, epoch, first
/// sequence number))`. Not part of the API: for the Redis Cluster slot test (issue 15).
#[cfg(feature = "test-util")]
#[doc(hidden)]
pub fn publish_script_call(
    stream: &protocol::names::StreamName,
    shard: ShardId,
    routing_version: RoutingVersion,
    sequence: Option<(&str, &str, u64)>,
    records: &[Record],
) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    let call = publish_script::Call {
        shard,
        presented: fence::Presented {
            version: routing_version,
            records: false,
            count: 0,
        },
        trim: publish_script::ScriptTrim::None,
        sequence: sequence.map(|(producer_id, epoch, first)| publish_script::Sequence {
            producer_id,
            epoch,
            first,
            gap: false,
            idle_ms: 60_000,
        }),
    };
    publish_script::PublishScript::default().add_call(&mut pipe, stream, call, records.iter());
    pipe
}

//! Consumer SDK of redis-stream-coord: many processes share a sharded Redis Stream the way Kafka consumer
//! groups share a topic, with Redis as the only infrastructure.
//!
//! A logical stream is split into shard streams (`redis-stream:shard:{<stream>:<n>:<salt>}`, see
//! [`protocol::keys::shard_stream`]). The coordinator assigns each shard to one member of a consumer group; this
//! crate is the member's side: it heartbeats, reads the shards it is given, hands their entries to your handler
//! (in order within a shard, shards in parallel), acknowledges them, and gives shards back safely when the group
//! rebalances.
//!
//! # Example
//! ```no_run
//! use stream_consumer::{CancellationToken, Consumer, Message};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let consumer = Consumer::builder("orders", "billing")
//!     .coordinator("http://coordinator-0:7400")
//!     .coordinator("http://coordinator-1:7400")
//!     .redis("redis://redis:6379")
//!     .member_id("billing-worker-1")
//!     .handler(|msg: Message| async move {
//!         println!("shard {} entry {}: {:?}", msg.shard(), msg.id(), msg.get_str("amount"));
//!         Ok::<_, std::io::Error>(())
//!     })
//!     .build()?;
//!
//! let shutdown = CancellationToken::new();
//! let on_signal = shutdown.clone();
//! tokio::spawn(async move {
//!     let _ = tokio::signal::ctrl_c().await;
//!     on_signal.cancel();
//! });
//! // Returns after a graceful close: in-flight work finished, shards reported revoked, group left.
//! let report = consumer.run(shutdown).await?;
//! assert!(report.left);
//! # Ok(())
//! # }
//! ```
//!
//! The same consumer pull-style, a `futures::Stream` of messages each acknowledged explicitly:
//! [`ConsumerBuilder::build_stream`] (its example), [`MessageStream`], [`PulledMessage::ack`].
//!
//! # Guarantees
//! * **At-least-once.** An entry is acknowledged (`XACK`) only after the handler returned `Ok`. A failed handler
//!   leaves it pending and it is retried with backoff; an entry delivered more than `max_deliveries` times goes
//!   to its shard's dead-letter stream ([`dead_letter`]). Handlers must be idempotent.
//! * **A lost acknowledgement is a redelivery.** An `XACK` is a Redis write like any other: a failover to a replica
//!   that had not received it yet loses it, and the promoted replica still lists the entry as pending. The reader's
//!   connection breaks with the failover, and a reader that reconnects re-delivers pending entries before it reads
//!   new ones (as the next owner of a moved shard does), so the handler runs again for that entry: at-least-once,
//!   never a loss. The consumer does not wait for replicas after an `XACK` (it would only make such a duplicate
//!   rarer); see [`docs/failure-handling.md`], "Data writes a Redis failover loses".
//! * **Per-shard order.** Entries of one shard are handled one at a time, in stream order; a failing entry holds
//!   its shard until it succeeds or is dead-lettered. Shards run concurrently.
//! * **No shard is read by two members at once**, as long as the coordinator's rules hold: a member reads a shard
//!   only after an `OK` answer assigns it, stops reading it as soon as an answer stops assigning it, and stops
//!   reading *everything* when its assignment lease runs out, which happens before the coordinator may expire it.
//!
//! # Lease and ordering contract
//! 1. The lease counts from the monotonic time captured *before* sending the heartbeat whose answer granted it
//!    (never from the answer's arrival), capped by [`Timings::assignment_lease`] and shortened by
//!    [`Timings::lease_safety_margin`]. The group rule `assignment lease <= member TTL` then guarantees that the
//!    consumer stops before the coordinator can hand its shards to someone else.
//! 2. A reader checks the lease and its shard's state after every blocking read returns and before every entry.
//!    The handler (and `on_assigned` / `on_revoked`) is polled under the lease end, checked before every poll, so
//!    it never completes after it even when the process resumes from a stall; every `XACK`, claim, retry and
//!    dead-letter command is sent only after checking the lease, with no `.await` in between (see [`Handler`],
//!    [`lease_deadline`]).
//! 3. When the lease runs out, every shard enters *local revoking state* and is never read again until a later
//!    `OK` assigns it; a failing heartbeat never resumes a shard.
//! 4. DRAIN (a shard in an answer's `revoke` list): stop new reads of the shard at once, let the entry in hand
//!    finish, call [`RebalanceListener::on_revoked`], then report the shard `REVOKED` (in a heartbeat sent at
//!    once).
//! 5. `FENCED_MEMBER_EPOCH` / `UNKNOWN_MEMBER`: every reader is stopped at once (handlers dropped),
//!    [`RebalanceListener::on_lost`] is called, and only then does the member join again (epoch 0).
//! 6. Before joining, the shard streams' Redis must pass a start-up check (reachable, 6.2 or newer, every command
//!    the consumer sends): [`ConsumerError::RedisUnusable`] otherwise ([`Consumer::start`] reports it at once).
//!    After joining, a member whose reader cannot read for longer than [`Timings::read_failure_timeout`] gives
//!    its shards back (leaves the group) and joins again once Redis passes the check.
//!
//! # Redis layout and decisions
//! * The Redis consumer group on every shard stream is named like the coordinator group; the Redis consumer name
//!   is the member id.
//! * A missing Redis group is created with `XGROUP CREATE <shard> <group> 0 MKSTREAM`: by default a brand-new
//!   group starts at the *beginning* of each shard, so nothing published before the first consumer started is
//!   lost ([`StartPosition::Beginning`]); [`ConsumerBuilder::start_from`] with [`StartPosition::End`] starts at
//!   new entries instead (`$`).
//! * One dedicated connection per shard reader for the blocking `XREADGROUP` (`BLOCK` =
//!   [`Timings::read_block`], response timeout longer than that), which also carries the acknowledgements of the
//!   previous batch just ahead of the read; one shared `ConnectionManager` for the rest. The dedicated one is a
//!   `redis_link::PipelinedConnection` (RESP2, plain TCP or Unix socket like the rest of the SDK): the read's
//!   reply, which carries every record, is decoded straight from its bytes into entries, at about half the client
//!   CPU per record of redis-rs's general reply parser ([`BENCHMARKS.md`], issue 17).
//! * On gaining a shard the reader first re-delivers the pending entries earlier owners left (`XAUTOCLAIM` from
//!   `0-0`, min-idle 0, to the end of the cursor), then reads new entries.
//! * Dead letters: `redis-stream:dead-letter:{<stream>:<n>:<salt>}` ([`protocol::keys::dead_letter_stream`]); fields
//!   in [`dead_letter`].
//! * The highest observed metadata version is kept through a [`VersionStore`] under `"<stream>/<group>"`:
//!   in memory by default, or in a file ([`FileVersionStore`]) so a restarted process still lets the coordinator
//!   detect a Redis rollback.
//!
//! # Fencing side effects
//! A lease bounds how long a member *reads* a shard, not how long a paused process takes to finish a write it
//! already started. Every [`Message`] carries the shard's [`FencingToken`] ([`Message::fencing_token`]): a number
//! the coordinator raises each time the shard gets a new owner (and never reuses, even after a Redis rollback).
//! Send it with every side effect and let the target refuse a token lower than one it has already seen; a worker
//! that resumes after its shard moved is then rejected instead of overwriting the new owner's work.
//! [`RebalanceListener::on_assigned`] gets the token too. The pattern, its limits, and a Redis script that
//! enforces it: [`docs/fencing.md`] and the [`fenced_writer`] example.
//! ```no_run
//! use stream_consumer::Message;
//!
//! async fn handle(msg: Message) -> Result<(), std::io::Error> {
//!     let token = msg.fencing_token().0;
//!     // e.g. EVALSHA <script> 1 <key> <field> <value> <token>: the script compares `token` with the highest
//!     // one stored for the key and refuses a lower one.
//!     # let _ = token;
//!     Ok(())
//! }
//! ```
//!
//! # Optional features
//! * `metrics` (default): records the consumer's metrics (assignment lease remaining, revoking shards, heartbeat
//!   outcomes by status, lease expiries, rejoins, rebalances, handler errors, dead letters) through the
//!   [`metrics`](https://docs.rs/metrics/0.24) facade. The application installs the recorder (the exporter of its
//!   choice) *before* building the consumer. Names and update points: [`metrics`]. Disable it with
//!   `default-features = false`; the [`metrics::names`] constants stay available.
//!
//! # Layout
//! How the crate is built inside (none of these modules needs to be known to use it):
//! * `config`: [`ConsumerConfig`], [`Timings`], [`StartPosition`]; validation.
//! * `builder`: [`ConsumerBuilder`] and [`Consumer::builder`]. `build()` is inert: it checks the settings and
//!   connects to nothing; the consumer starts with [`Consumer::run`], [`Consumer::start`] or [`Consumer::spawn`].
//! * `consumer`: [`Consumer`] (run or spawn), [`ConsumerHandle`] (owns the tasks: close, abort, status).
//! * `status`: [`ConsumerStatus`], [`HeartbeatCounters`], [`CloseReport`].
//! * `redis_check`: the start-up check of the shard streams' Redis ([`RedisUnusableReason`] when it fails).
//! * `handler`: the [`Handler`] and [`RebalanceListener`] traits.
//! * `message`: [`Message`] and [`EntryId`].
//! * `outcome`: [`Outcome`], handler outcomes beyond `Ok` and `Err` (retry after a delay, dead-letter now).
//! * `pull`: [`MessageStream`] of [`PulledMessage`]s with explicit acks ([`ConsumerBuilder::build_stream`]).
//! * membership: the pure client-side membership state built from coordinator answers (what to start, drain,
//!   report) is `client_core::membership`, shared with the test models, driven by the supervisor.
//! * `lease`: the pure assignment lease of `client_core::lease` (counted from the heartbeat's send time), the
//!   lease view the readers share and the combinator that polls a handler under the lease end.
//! * `in_flight`: per-shard in-flight counters.
//! * `supervisor`: the member supervisor; heartbeats (`supervisor::heartbeat`), drives membership and lease,
//!   starts and stops the readers (`supervisor::readers`).
//! * `redis_nodes`: opens the shared connection and the nodes of the blocking reads (`redis_link::Nodes`).
//! * `shard_reader`: one task per shard: claim pending entries, blocking reads, handler, ack, retry,
//!   dead-letter.
//! * `stream_reply`: parsing of `XREADGROUP` / `XAUTOCLAIM` / `XPENDING` replies.
//! * [`dead_letter`]: the dead-letter entry format.
//! * [`version_store`]: the version-store SPI (re-exported from `client_core`, shared with the producer; declared
//!   in this file).
//! * `error`: [`ConsumerError`] (with [`is_retryable`](ConsumerError::is_retryable)), [`ConfigError`],
//!   [`HandlerError`], [`RedisUnusableReason`]. [`CoordError`], [`RedisCheckError`] and [`RedisFailure`] (the
//!   Redis client's error, wrapped; [`HttpFailure`] is the HTTP client's), which they carry, are re-exported.
//! * [`metrics`]: metric names, labels, and where each is updated.
//!
//! The coordinator HTTP client (several URLs, failover on connection errors and on
//! `503 COORDINATOR_TERMINATING`) is `client_core::CoordClient`, shared with the producer SDK.
//!
//! [`docs/failure-handling.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/failure-handling.md
//! [`BENCHMARKS.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/BENCHMARKS.md
//! [`docs/fencing.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/fencing.md
//! [`fenced_writer`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/examples/src/bin/fenced_writer.rs
#![warn(missing_docs)]

mod builder;
mod config;
mod consumer;
pub mod dead_letter;
mod error;
mod handler;
mod in_flight;
mod lease;
mod message;
pub mod metrics;
mod outcome;
mod pull;
mod redis_check;
mod redis_nodes;
mod shard_reader;
mod status;
mod stream_reply;
mod supervisor;
/// The version-store SPI, shared with the producer SDK (defined once in `client_core`, re-exported here).
///
/// The consumer keeps the highest group metadata version it has ever observed under the key
/// `"<stream>/<group>"` ([`version_key`](version_store::version_key)). It loads it once at start and stores it
/// every time it grows, retrying a failed write until it succeeds ([`client_core::persist`]: the consumer keeps reading within its lease
/// meanwhile, and says so in a `warn` log and the `redis_stream_consumer_version_store_failures_total` /
/// `redis_stream_consumer_version_unpersisted` metrics). The default is the process-wide
/// [`MemoryVersionStore::process`], shared by every consumer and producer of the process, so a consumer
/// recreated in the same process still reports what an earlier one saw; [`FileVersionStore`] keeps it across
/// restarts, so a restarted process still reports the version it saw before, and the coordinator notices a
/// Redis rollback that happened while the process was down. A custom store (a database row, a config service)
/// implements [`VersionStore`]; see [`examples/custom_version_store.rs`].
///
/// [`examples/custom_version_store.rs`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/stream-consumer/examples/custom_version_store.rs
pub mod version_store {
    pub use client_core::version_store::group_version_key as version_key;
    pub use client_core::{FileVersionStore, MemoryVersionStore, VersionStore, VersionStoreError};
}

pub use builder::ConsumerBuilder;
pub use config::{ConsumerConfig, StartPosition, Timings, DEFAULT_BATCH_SIZE, DEFAULT_MAX_DELIVERIES};
pub use consumer::{Consumer, ConsumerHandle};
pub use error::{ConfigError, ConsumerError, HandlerError, RedisUnusableReason};
pub use handler::{Handler, RebalanceListener};
pub use lease::lease_deadline;
pub use message::{EntryId, Message, ParseEntryIdError};
pub use outcome::{Outcome, MAX_RETRY_DELAY};
pub use pull::{AckError, MessageStream, PulledMessage};
pub use status::{CloseReport, ConsumerStatus, HeartbeatCounters};
pub use version_store::{FileVersionStore, MemoryVersionStore, VersionStore, VersionStoreError};

pub use client_core::{CoordError, HttpErrorKind, HttpFailure, RedisCheckError, RedisErrorKind, RedisFailure};
pub use protocol::names::{GroupName, MemberId, StreamName};
pub use protocol::{FencingToken, ShardId, Status};
pub use tokio_util::sync::CancellationToken;

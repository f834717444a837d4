//! Typed errors: configuration ([`ConfigError`]), routing refresh ([`RefreshError`]), per-record publishing
//! ([`PublishError`] with its [`WriteState`]), batches ([`BatchError`]) and the handle ([`ProducerError`]).
//!
//! The one question a caller must be able to answer after a failed publish is "may I send this record again
//! without creating a duplicate?". [`PublishError::write_state`] answers it:
//!
//! | [`WriteState`] | meaning | safe to retry? |
//! |---|---|---|
//! | [`NotWritten`](WriteState::NotWritten) | the record never reached Redis, or Redis refused it | yes |
//! | [`Unknown`](WriteState::Unknown) | the request left, the answer did not come back (connection dropped, timeout); or, for a durable producer, the master wrote the record but too few replicas confirmed it in time ([`PublishError::NotReplicated`]) | only if duplicates are acceptable (at-least-once) |
//! | [`Written`](WriteState::Written) | the record is in its shard stream (only in a [`BatchError`]'s outcomes); for a durable producer, also on at least `min` replicas | no |

use std::sync::Arc;
use std::time::Duration;

use client_core::{CoordError, RedisCheckError, RedisFailure, VersionStoreError};
use protocol::names::StreamName;
use protocol::{RoutingVersion, ShardId, Status};
use thiserror::Error;

use crate::published::Published;

/// A producer configuration that [`ProducerBuilder::build`](crate::ProducerBuilder::build) refuses; nothing was
/// built. The one vocabulary of both SDKs (`client_core::ConfigError`, also `stream_consumer::ConfigError`).
pub use client_core::ConfigError;

/// A routing refresh failed. The cache is kept while its lease holds.
///
/// ```
/// use stream_producer::{PublishError, RefreshError};
///
/// fn explain(e: &PublishError) -> Option<String> {
///     let PublishError::NoRouting { last_error: Some(refresh), .. } = e else {
///         return None;
///     };
///     let refresh: &RefreshError = refresh;
///     Some(if refresh.is_not_found() {
///         "the stream was never created: create it with the coordinator's admin API".to_owned()
///     } else if refresh.is_retryable() {
///         format!("the coordinator is not answering yet: {refresh}")
///     } else {
///         format!("routing cannot be fetched: {refresh}")
///     })
/// }
/// # let _ = explain;
/// ```
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RefreshError {
    /// The coordinator could not be reached or answered an error (for example `METADATA_UNAVAILABLE` when the
    /// stream has no routing).
    #[error("routing refresh failed: {0}")]
    Coordinator(#[from] CoordError),
    /// The coordinator answered a status a routing fetch never returns.
    #[error("routing refresh answered an unexpected status {0}")]
    UnexpectedStatus(Status),
    /// The version store could not be read before the first refresh.
    #[error("version store unreadable: {0}")]
    VersionStore(#[from] VersionStoreError),
}

impl RefreshError {
    /// Whether the coordinator answered `NOT_FOUND`: the stream was never created (a typo, or a missing create).
    pub fn is_not_found(&self) -> bool {
        matches!(self, RefreshError::Coordinator(e) if e.status() == Some(Status::NotFound))
    }

    /// Whether another attempt may succeed: the coordinator was unreachable or answered a retryable status
    /// (`STORE_UNAVAILABLE`, `METADATA_UNAVAILABLE`, `COORDINATOR_TERMINATING`, `RATE_LIMITED`; see
    /// [`CoordError::is_retryable`]). An unexpected status or an unreadable version store is final.
    pub fn is_retryable(&self) -> bool {
        match self {
            RefreshError::Coordinator(e) => e.is_retryable(),
            RefreshError::UnexpectedStatus(_) | RefreshError::VersionStore(_) => false,
        }
    }
}

/// Whether a record reached its shard stream.
///
/// ```
/// use stream_producer::{PublishError, WriteState};
///
/// fn may_resend(e: &PublishError, duplicates_ok: bool) -> bool {
///     match e.write_state() {
///         WriteState::NotWritten => e.is_retryable(),
///         WriteState::Unknown => duplicates_ok && e.is_retryable(),
///         WriteState::Written => false,
///     }
/// }
/// assert!(!may_resend(&PublishError::Closed, true));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteState {
    /// The record is in its shard stream (for a durable producer: and confirmed by at least the required number
    /// of replicas, see [`Durability`](crate::Durability)).
    Written,
    /// The record is not in any shard stream: retrying cannot duplicate it.
    NotWritten,
    /// The request may or may not have been executed (the connection dropped or timed out after it left), or it
    /// was executed on the master but not confirmed by enough replicas ([`PublishError::NotReplicated`]), so a
    /// failover may still lose it: retrying may duplicate it.
    Unknown,
}

/// Publishing one record failed.
///
/// Cheap to clone (sources are shared), because one failed pipeline fails every record in it.
///
/// ```
/// # async fn example(producer: &stream_producer::Producer) {
/// use stream_producer::{PublishError, WriteState};
///
/// match producer.send("customer-42", &[("amount", "12.50")]).await {
///     Ok(published) => println!("written: {}", published.id),
///     Err(e) if e.write_state() == WriteState::NotWritten && e.is_retryable() => {
///         eprintln!("not written, safe to send again: {e}")
///     }
///     Err(e @ PublishError::NotReplicated { .. }) => eprintln!("on the master only: {e}"),
///     Err(e) => eprintln!("{:?}: {e}", e.write_state()),
/// }
/// # }
/// ```
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The routing lease ended and no refresh has succeeded since: the producer fails closed and writes nothing
    /// rather than route with a shard count that may be stale.
    #[error("routing of stream {stream} expired {expired_for:?} ago (version {version}) and cannot be refreshed")]
    RoutingExpired {
        /// The stream.
        stream: StreamName,
        /// How long ago the lease ended.
        expired_for: Duration,
        /// The routing version whose lease ended.
        version: RoutingVersion,
        /// The last refresh failure, if one is known.
        #[source]
        last_error: Option<Arc<RefreshError>>,
    },
    /// No routing was ever fetched (coordinator unreachable, or the stream has no routing yet).
    #[error("no routing for stream {stream} yet")]
    NoRouting {
        /// The stream.
        stream: StreamName,
        /// The last refresh failure, if one is known.
        #[source]
        last_error: Option<Arc<RefreshError>>,
    },
    /// Redis answered the XADD with an error (wrong type, out of memory, read-only replica, ...).
    #[error("Redis refused the record for shard {shard}: {source}")]
    Rejected {
        /// The shard.
        shard: ShardId,
        /// Redis's error reply.
        #[source]
        source: RedisFailure,
    },
    /// No connection to Redis could be opened; the request never left.
    #[error("cannot connect to Redis for shard {shard}: {source}")]
    Connect {
        /// The shard.
        shard: ShardId,
        /// The connection error.
        #[source]
        source: RedisFailure,
    },
    /// The connection failed before the records left: the fenced producer's check of the shard's fence (the first
    /// of its two round trips) got no answer, or an earlier batch of the same call lost the connection. Nothing
    /// of these records was sent.
    #[error("connection to Redis failed before shard {shard}'s records were sent: {source}")]
    NotSent {
        /// The shard.
        shard: ShardId,
        /// The transport error.
        #[source]
        source: RedisFailure,
    },
    /// The Redis server cannot serve the producer: too old, or a command it sends is missing or renamed (checked
    /// on the first connection). Nothing was written, and retrying cannot help until Redis is fixed.
    #[error("Redis cannot serve the producer: {source}")]
    RedisUnsupported {
        /// The failed check, naming the server (without password) and what is missing.
        #[source]
        source: Arc<RedisCheckError>,
    },
    /// The request left but its answer did not arrive (connection dropped, reset or timed out).
    #[error("connection to Redis lost while publishing to shard {shard}: {source}")]
    ConnectionLost {
        /// The shard.
        shard: ShardId,
        /// The transport error.
        #[source]
        source: RedisFailure,
    },
    /// A durable producer ([`Durability::Replicas`](crate::Durability::Replicas)): the master executed the write,
    /// but fewer than `required` of its replicas confirmed it before the timeout (`WAIT` answered `acked`), or the
    /// `WAIT` got no count back (`source`: refused, for example by an ACL, or an answer that is not a count).
    /// Unknown: the record is in the master's stream now, and a failover to a replica that has not received it
    /// loses it. Sending it again may duplicate it.
    #[error("shard {shard}: written on the master, confirmed by {acked} of {required} replicas in time{}",
        source.as_ref().map(|e| format!(" (WAIT failed: {e})")).unwrap_or_default())]
    NotReplicated {
        /// The shard.
        shard: ShardId,
        /// Replicas that confirmed the write (0 when `WAIT` failed).
        acked: u32,
        /// Replicas the producer's durability requires.
        required: u32,
        /// Why `WAIT` answered no count, when it did not.
        #[source]
        source: Option<RedisFailure>,
    },
    /// The shard is fenced for the producer's routing version: the stream was resharded (its keys may move) and
    /// the producer has not seen the new routing yet. Nothing was written; the producer refreshes its routing at
    /// once, so sending the record again routes it with the new routing. The producer does so itself unless
    /// [`reroute_fenced`](crate::ProducerBuilder::reroute_fenced) is off; with it on, this reaches the caller
    /// only when the coordinator did not serve the fenced version within `coordinator_timeout`, or after 3
    /// re-routes.
    #[error("shard {shard} is fenced at routing version {fence}; the producer holds {routing_version}")]
    Fenced {
        /// The shard.
        shard: ShardId,
        /// The routing version the record was routed with.
        routing_version: RoutingVersion,
        /// The lowest routing version the shard accepts: its fence or its birth; one above `routing_version` when
        /// the shard has no record at the producer's routing or its record names a layout with more shards than
        /// the producer's (a routing Redis lost or restored over). The refresh this starts brings the routing
        /// Redis stores, and the next send routes by it.
        fence: RoutingVersion,
    },
    /// The idempotent producer's sequence number leaves a gap after the last one the shard has seen from it (its
    /// state in Redis was lost, for example by a failover, and could not be resumed). Nothing was written.
    #[error("out-of-order sequence {sequence} for shard {shard} (the shard expects {expected})")]
    OutOfOrderSequence {
        /// The shard.
        shard: ShardId,
        /// The first sequence number of the refused call.
        sequence: u64,
        /// The sequence number the shard expects next.
        expected: u64,
    },
    /// The idempotent producer retried a call older than the one the shard remembers: whether an earlier attempt
    /// wrote it is no longer known. The SDK only retries the one call per shard it has in flight, so this means
    /// its state in Redis was changed behind its back (another live producer with the same id).
    #[error("sequence {sequence} for shard {shard} is older than the remembered window (next {next})")]
    SequenceOutOfWindow {
        /// The shard.
        shard: ShardId,
        /// The first sequence number of the call.
        sequence: u64,
        /// The sequence number the shard expects next.
        next: u64,
    },
    /// On a Redis Cluster, the shard's slot did not settle within the call: more `MOVED`/`ASK` redirects in a row
    /// than the producer follows, or the cluster answered `TRYAGAIN` / `CLUSTERDOWN` (or a node was unreachable)
    /// until the call's deadline. Every command that got such an answer did not run: nothing was written.
    #[error("Redis Cluster did not settle shard {shard}'s slot ({reason}): {source}")]
    ClusterUnsettled {
        /// The shard.
        shard: ShardId,
        /// Which bound was reached.
        reason: &'static str,
        /// The last answer.
        #[source]
        source: RedisFailure,
    },
    /// Redis answered something that is not an entry id.
    #[error("unexpected answer to XADD on shard {shard}: {detail}")]
    UnexpectedReply {
        /// The shard.
        shard: ShardId,
        /// What came back.
        detail: String,
    },
    /// The record cannot be published as given.
    #[error("invalid record: {0}")]
    InvalidRecord(&'static str),
    /// The producer is closed (or closing) and accepts no more records.
    #[error("the producer is closed")]
    Closed,
    /// The producer was dropped while the record was queued or in flight.
    #[error("the producer was dropped before the record's outcome was known")]
    Abandoned,
}

impl PublishError {
    /// Whether the record may be in its shard stream.
    pub fn write_state(&self) -> WriteState {
        match self {
            PublishError::ConnectionLost { .. }
            | PublishError::NotReplicated { .. }
            | PublishError::UnexpectedReply { .. }
            | PublishError::SequenceOutOfWindow { .. }
            | PublishError::Abandoned => WriteState::Unknown,
            PublishError::Fenced { .. }
            | PublishError::OutOfOrderSequence { .. }
            | PublishError::ClusterUnsettled { .. } => WriteState::NotWritten,
            PublishError::RoutingExpired { .. }
            | PublishError::NoRouting { .. }
            | PublishError::Rejected { .. }
            | PublishError::Connect { .. }
            | PublishError::NotSent { .. }
            | PublishError::RedisUnsupported { .. }
            | PublishError::InvalidRecord(_)
            | PublishError::Closed => WriteState::NotWritten,
        }
    }

    /// Whether sending the same record again later may succeed (routing outages, connection problems, Redis
    /// errors that redis-rs classifies as retryable). Check [`write_state`](Self::write_state) first: retrying an
    /// [`Unknown`](WriteState::Unknown) record may duplicate it.
    pub fn is_retryable(&self) -> bool {
        match self {
            // A stream the coordinator says was never created stays so until someone creates it.
            PublishError::NoRouting { last_error, .. } => {
                !last_error.as_deref().is_some_and(RefreshError::is_not_found)
            }
            PublishError::RoutingExpired { .. }
            | PublishError::Connect { .. }
            | PublishError::NotSent { .. }
            | PublishError::ConnectionLost { .. }
            | PublishError::NotReplicated { .. }
            | PublishError::Fenced { .. }
            | PublishError::OutOfOrderSequence { .. }
            | PublishError::ClusterUnsettled { .. } => true,
            PublishError::Rejected { source, .. } => source.is_retryable(),
            PublishError::UnexpectedReply { .. }
            | PublishError::SequenceOutOfWindow { .. }
            | PublishError::RedisUnsupported { .. }
            | PublishError::InvalidRecord(_)
            | PublishError::Closed
            | PublishError::Abandoned => false,
        }
    }

    /// Whether the record was written on the master but not confirmed by enough replicas in time (see
    /// [`PublishError::NotReplicated`]).
    pub fn is_not_replicated(&self) -> bool {
        matches!(self, PublishError::NotReplicated { .. })
    }

    /// Whether a shard fence refused the record (see [`PublishError::Fenced`]).
    pub fn is_fenced(&self) -> bool {
        matches!(self, PublishError::Fenced { .. })
    }

    /// Whether the producer refused the record for lack of a valid routing (fail closed).
    pub fn is_routing_unavailable(&self) -> bool {
        matches!(
            self,
            PublishError::RoutingExpired { .. } | PublishError::NoRouting { .. }
        )
    }
}

/// The outcome of one record of a batch.
///
/// ```
/// # async fn example(producer: &stream_producer::Producer, records: Vec<stream_producer::Record>) {
/// use stream_producer::RecordOutcome;
///
/// if let Err(batch) = producer.send_batch(records.clone()).await {
///     for (record, outcome) in records.into_iter().zip(batch.outcomes()) {
///         match outcome {
///             RecordOutcome::Written(p) => println!("written at {}", p.id),
///             RecordOutcome::NotWritten(e) => eprintln!("not written, send again: {e} ({record:?})"),
///             RecordOutcome::Unknown(e) => eprintln!("maybe written: {e}"),
///         }
///     }
/// }
/// # }
/// ```
#[derive(Debug, Clone)]
pub enum RecordOutcome {
    /// The record is in its shard stream.
    Written(Published),
    /// The record is not in any shard stream: safe to retry.
    NotWritten(PublishError),
    /// The record may or may not be in its shard stream.
    Unknown(PublishError),
}

impl RecordOutcome {
    /// Sorts a result by its [`WriteState`].
    pub fn from_result(result: Result<Published, PublishError>) -> Self {
        match result {
            Ok(p) => RecordOutcome::Written(p),
            Err(e) => match e.write_state() {
                WriteState::Unknown => RecordOutcome::Unknown(e),
                WriteState::NotWritten | WriteState::Written => RecordOutcome::NotWritten(e),
            },
        }
    }

    /// The record's write state.
    pub fn write_state(&self) -> WriteState {
        match self {
            RecordOutcome::Written(_) => WriteState::Written,
            RecordOutcome::NotWritten(_) => WriteState::NotWritten,
            RecordOutcome::Unknown(_) => WriteState::Unknown,
        }
    }

    /// The publication, when written.
    pub fn published(&self) -> Option<&Published> {
        match self {
            RecordOutcome::Written(p) => Some(p),
            _ => None,
        }
    }

    /// The error, when not written or unknown.
    pub fn error(&self) -> Option<&PublishError> {
        match self {
            RecordOutcome::Written(_) => None,
            RecordOutcome::NotWritten(e) | RecordOutcome::Unknown(e) => Some(e),
        }
    }
}

/// Some records of a batch were not written (or their outcome is unknown).
///
/// Holds one [`RecordOutcome`] per record, in the order the records were given, so a caller can resend exactly
/// the [`NotWritten`](RecordOutcome::NotWritten) ones.
///
/// ```
/// # async fn example(producer: &stream_producer::Producer, records: Vec<stream_producer::Record>) {
/// use stream_producer::WriteState;
///
/// if let Err(batch) = producer.send_batch(records.clone()).await {
///     // Exactly the records that are safe to send again.
///     let again: Vec<_> = batch.indices(WriteState::NotWritten).into_iter().map(|i| records[i].clone()).collect();
///     eprintln!("{batch}; sending {} again", again.len());
///     let _ = producer.send_batch(again).await;
/// }
/// # }
/// ```
#[derive(Debug, Clone, Error)]
#[error("{} of {} records not written, {} unknown{}", self.count(WriteState::NotWritten), self.outcomes.len(),
    self.count(WriteState::Unknown), self.first_error().map(|e| format!(" (first error: {e})")).unwrap_or_default())]
pub struct BatchError {
    outcomes: Vec<RecordOutcome>,
}

impl BatchError {
    pub(crate) fn new(outcomes: Vec<RecordOutcome>) -> Self {
        BatchError { outcomes }
    }

    /// One outcome per record, in input order.
    pub fn outcomes(&self) -> &[RecordOutcome] {
        &self.outcomes
    }

    /// The outcomes, in input order.
    pub fn into_outcomes(self) -> Vec<RecordOutcome> {
        self.outcomes
    }

    /// How many records are in `state`.
    pub fn count(&self, state: WriteState) -> usize {
        self.outcomes.iter().filter(|o| o.write_state() == state).count()
    }

    /// Indices (into the batch) of the records in `state`.
    pub fn indices(&self, state: WriteState) -> Vec<usize> {
        self.outcomes
            .iter()
            .enumerate()
            .filter(|(_, o)| o.write_state() == state)
            .map(|(i, _)| i)
            .collect()
    }

    /// The first error of the batch.
    pub fn first_error(&self) -> Option<&PublishError> {
        self.outcomes.iter().find_map(RecordOutcome::error)
    }
}

/// An operation of the producer handle failed.
///
/// ```
/// # async fn example(producer: stream_producer::Producer) {
/// match producer.close().await {
///     Ok(stats) => println!("closed after {} records", stats.records_written),
///     Err(e) if e.is_panic() => eprintln!("a producer task panicked: {e}"),
///     Err(e) => eprintln!("{e}"),
/// }
/// # }
/// ```
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProducerError {
    /// The producer is closed.
    #[error("the producer is closed")]
    Closed,
    /// A background task of the producer panicked (or was cancelled by its runtime shutting down).
    #[error("a producer task failed: {0}")]
    TaskFailed(#[source] tokio::task::JoinError),
}

impl ProducerError {
    /// Whether a background task panicked (as opposed to being cancelled because its runtime shut down).
    pub fn is_panic(&self) -> bool {
        matches!(self, ProducerError::TaskFailed(e) if e.is_panic())
    }
}

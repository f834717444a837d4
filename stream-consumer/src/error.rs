//! Errors of the consumer SDK.

use client_core::{CoordError, RedisCheckError, RedisFailure, VersionStoreError};
use protocol::Status;
use std::time::Duration;
use thiserror::Error;

/// The error a handler returns; any error type converts into it (`anyhow::Error`, `std::io::Error`, a `String`).
///
/// ```
/// use stream_consumer::{HandlerError, Message};
///
/// // `?` turns any error into a `HandlerError`: the entry stays pending and is retried.
/// async fn handle(msg: Message) -> Result<(), HandlerError> {
///     let amount: u64 = msg.get_str("amount").ok_or("no amount field")?.parse()?;
///     println!("charging {amount}");
///     Ok(())
/// }
/// # let _ = handle;
/// ```
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A consumer configuration that [`ConsumerBuilder::build`](crate::ConsumerBuilder::build) refuses; nothing was
/// built. The one vocabulary of both SDKs (`client_core::ConfigError`, also `stream_producer::ConfigError`).
pub use client_core::ConfigError;

/// A consumer stopped with an error.
///
/// ```
/// # async fn example(consumer: stream_consumer::Consumer) {
/// use stream_consumer::{CancellationToken, ConsumerError};
///
/// match consumer.run(CancellationToken::new()).await {
///     Ok(report) => println!("closed; left the group: {}", report.left),
///     Err(e @ ConsumerError::Replaced { .. }) => eprintln!("another process took over: {e}"),
///     Err(e) if e.is_retryable() => eprintln!("an outage; start again later: {e}"),
///     Err(e) => eprintln!("fix the configuration or the deployment: {e}"),
/// }
/// # }
/// ```
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The version store could not be read at start, so a Redis rollback could go unnoticed: the consumer
    /// refuses to start rather than run without that protection.
    #[error("cannot load the highest observed metadata version: {0}")]
    VersionStore(#[from] VersionStoreError),
    /// The coordinator refused the consumer in a way retrying cannot fix (bad token, invalid request) before it
    /// ever joined.
    #[error("the coordinator refused the consumer: {0}")]
    Coordinator(#[source] CoordError),
    /// The coordinator client could not be built.
    #[error("cannot build the coordinator client: {0}")]
    CoordinatorClient(#[source] CoordError),
    /// The Redis client could not be set up.
    #[error("cannot set up the Redis client: {0}")]
    Redis(#[source] RedisFailure),
    /// The shard streams' Redis failed the start-up check, so the consumer did not join (it would have been
    /// assigned shards it cannot read).
    #[error("Redis at {url} cannot be used: {reason}")]
    RedisUnusable {
        /// The Redis URL, without its password.
        url: String,
        /// What failed: the connection, the check's answer, or its deadline.
        #[source]
        reason: RedisUnusableReason,
    },
    /// Another process joined the group under this consumer's member id and holds it now (`MEMBER_REPLACED`):
    /// this consumer stopped every reader and does not rejoin, since two processes under one name would replace
    /// each other in turn. It is what a process sees after it was stalled or partitioned while its replacement
    /// started, or when two processes are configured with the same member id.
    #[error("another process holds member id {member_id} now; this consumer stopped: {source}")]
    Replaced {
        /// The member id.
        member_id: String,
        /// The coordinator's refusal.
        #[source]
        source: CoordError,
    },
    /// A background task of the consumer panicked or was aborted.
    #[error("consumer task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// Why the shard streams' Redis failed the consumer's start-up check ([`ConsumerError::RedisUnusable`]).
///
/// ```
/// use stream_consumer::{ConsumerError, RedisUnusableReason};
///
/// fn explain(e: &ConsumerError) -> Option<String> {
///     let ConsumerError::RedisUnusable { url, reason } = e else {
///         return None;
///     };
///     Some(match reason {
///         RedisUnusableReason::TimedOut(after) => format!("{url} did not answer within {after:?}"),
///         r if r.is_unsupported() => format!("{url} cannot serve the consumer: {r}"),
///         r => format!("{url} is unreachable for now: {r}"),
///     })
/// }
/// # let _ = explain;
/// ```
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RedisUnusableReason {
    /// No connection could be opened.
    #[error("cannot connect: {0}")]
    Connect(#[source] RedisFailure),
    /// The server answered, and is too old, lacks a command the consumer sends, or answered the check with an
    /// error.
    #[error(transparent)]
    Check(#[from] RedisCheckError),
    /// The check did not finish within its deadline.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

impl RedisUnusableReason {
    /// Whether the server cannot serve the consumer as configured (too old, a command missing or renamed):
    /// retrying cannot help until Redis is fixed. A connection failure or a timeout may pass.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, RedisUnusableReason::Check(e) if e.is_unsupported())
    }
}

impl ConsumerError {
    /// The coordinator's status, when the coordinator refused the consumer.
    pub fn coordinator_status(&self) -> Option<Status> {
        match self {
            ConsumerError::Coordinator(e) | ConsumerError::Replaced { source: e, .. } => e.status(),
            _ => None,
        }
    }

    /// Whether starting the consumer again later may succeed without changing its configuration: an outage of
    /// the version store, of Redis or of the coordinator. `false` for a refusal that only a configuration or
    /// deployment change fixes (a bad token, an unreadable version store, a Redis too old or missing a command,
    /// an invalid Redis URL) and for a task that panicked.
    pub fn is_retryable(&self) -> bool {
        match self {
            ConsumerError::VersionStore(e) => !matches!(e, VersionStoreError::Corrupt(_)),
            ConsumerError::Coordinator(e) => e.is_retryable(),
            ConsumerError::RedisUnusable { reason, .. } => !reason.is_unsupported(),
            // Starting it again would take the member id back from the process that holds it now.
            ConsumerError::Replaced { .. } => false,
            ConsumerError::CoordinatorClient(_) | ConsumerError::Redis(_) | ConsumerError::Task(_) => false,
        }
    }
}

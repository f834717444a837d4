//! The configuration errors of both SDKs: one vocabulary, so a `match` on a refused producer or consumer
//! configuration reads the same, and a rule both SDKs share (a URL, a name, a range) is worded once.
//!
//! `stream_producer::ConfigError` and `stream_consumer::ConfigError` are this type. Variants that only one SDK
//! can return say which.

use std::time::Duration;

use protocol::NameError;
use thiserror::Error;

use crate::coord_client::CoordError;

/// A producer or consumer configuration that the builder's `build` refuses; nothing was built.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A stream, group or member id is not a valid name.
    #[error("invalid name: {0}")]
    InvalidName(#[from] NameError),
    /// No coordinator URL was given.
    #[error("at least one coordinator URL is required")]
    MissingCoordinator,
    /// A coordinator URL is not `http(s)://...`.
    #[error("coordinator URL {0:?} must start with http:// or https://")]
    InvalidCoordinatorUrl(String),
    /// The TLS settings of the coordinator URLs cannot be used (a CA or certificate file missing or not PEM, a
    /// certificate without its key).
    #[error("coordinator TLS: {0}")]
    CoordinatorTls(#[source] crate::coord_tls::TlsConfigError),
    /// The coordinator HTTP client could not be built (the HTTP stack refused its settings). Producer only.
    #[error("cannot build the coordinator client: {0}")]
    CoordinatorClient(#[source] CoordError),
    /// No Redis URL was given.
    #[error("a Redis URL is required")]
    MissingRedisUrl,
    /// The Redis URL does not parse.
    #[error("invalid Redis URL {url:?}: {source}")]
    InvalidRedisUrl {
        /// The URL as given, with its credentials replaced by `***`.
        url: String,
        /// Why redis-rs refused it.
        #[source]
        source: redis::RedisError,
    },
    /// The Redis target is empty or a `cluster:` list of seed URLs is malformed (an empty or invalid seed, too
    /// many seeds, a database other than 0).
    #[error("invalid Redis target: {0}")]
    InvalidRedisTarget(#[from] redis_link::TargetError),
    /// A setting is outside its range.
    #[error("invalid setting `{setting}`: must be {rule} (got {value})")]
    OutOfRange {
        /// The setting.
        setting: &'static str,
        /// The rule it breaks.
        rule: &'static str,
        /// The value given.
        value: String,
    },
    /// A retry backoff's minimum is above its maximum (the producer's routing refresh retry, the consumer's
    /// handler retry).
    #[error("retry backoff minimum ({min:?}) must not exceed its maximum ({max:?})")]
    RetryBackoffInverted {
        /// The minimum.
        min: Duration,
        /// The maximum.
        max: Duration,
    },
    /// No handler was given. Consumer only.
    #[error("a message handler is required")]
    MissingHandler,
    /// The assignment lease is longer than the member TTL: the consumer could keep reading after the
    /// coordinator expired it and gave its shards to someone else. Consumer only.
    #[error("assignment lease ({lease:?}) must not exceed the member TTL ({ttl:?})")]
    LeaseAboveTtl {
        /// The configured assignment lease.
        lease: Duration,
        /// The configured member TTL.
        ttl: Duration,
    },
    /// The heartbeat interval is not shorter than the assignment lease: one late heartbeat would stop reading.
    /// Consumer only.
    #[error("heartbeat interval ({heartbeat:?}) must be shorter than the assignment lease ({lease:?})")]
    HeartbeatNotBelowLease {
        /// The configured heartbeat interval.
        heartbeat: Duration,
        /// The configured assignment lease.
        lease: Duration,
    },
    /// The request timeout is not shorter than the assignment lease: one slow answer would outlive the lease.
    /// Consumer only.
    #[error("coordinator request timeout ({timeout:?}) must be shorter than the assignment lease ({lease:?})")]
    RequestTimeoutNotBelowLease {
        /// The configured request timeout.
        timeout: Duration,
        /// The configured assignment lease.
        lease: Duration,
    },
    /// The lease safety margin takes half the lease or more. Consumer only.
    #[error("lease safety margin ({margin:?}) must be less than half the assignment lease ({lease:?})")]
    MarginTooLarge {
        /// The configured margin.
        margin: Duration,
        /// The configured assignment lease.
        lease: Duration,
    },
    /// The queue could never hold one full batch. Producer only.
    #[error("queue_capacity ({queue_capacity}) must be at least max_batch_size ({max_batch_size})")]
    QueueSmallerThanBatch {
        /// The queue capacity.
        queue_capacity: usize,
        /// The batch size.
        max_batch_size: usize,
    },
    /// The producer's replica durability timeout is not below the Redis response timeout: a `WAIT` that runs
    /// its full time would read as a lost connection instead of a "not replicated" publish error. Producer only.
    #[error("durability timeout ({wait:?}) must be below redis_response_timeout ({response:?})")]
    ReplicaWaitNotBelowResponseTimeout {
        /// The durability timeout.
        wait: Duration,
        /// The Redis response timeout.
        response: Duration,
    },
    /// A setting needs the fenced publish script, which was turned off (`fencing(false)`). Producer only.
    #[error("{setting} needs the fenced publish script (fencing(true))")]
    ScriptRequired {
        /// The setting.
        setting: &'static str,
    },
    /// The idempotent producer's id breaks a rule. Producer only.
    #[error("invalid producer id {id:?}: {rule}")]
    InvalidProducerId {
        /// The id given.
        id: String,
        /// The rule it breaks.
        rule: &'static str,
    },
}

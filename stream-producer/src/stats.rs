//! Counters of a producer, and the snapshot callers read ([`ProducerStats`]).
//!
//! These are the producer's signals from the failure-handling design: routing cache age and refresh failures,
//! routing rollbacks (`SYNC_METADATA`), and publish outcomes by write state. The same signals go to the `metrics`
//! facade (see [`crate::metrics`]) from the same places.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use protocol::names::StreamName;
use protocol::RoutingVersion;

use crate::metrics::ProducerMetrics;

/// Live counters, shared by the producer's tasks.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub refreshes: AtomicU64,
    pub refresh_failures: AtomicU64,
    pub routing_updates: AtomicU64,
    pub sync_metadata_responses: AtomicU64,
    pub routing_rollbacks: AtomicU64,
    pub ignored_older_responses: AtomicU64,
    pub version_store_failures: AtomicU64,
    pub routing_refusals: AtomicU64,
    pub records_written: AtomicU64,
    pub records_not_written: AtomicU64,
    pub records_unknown: AtomicU64,
    pub records_not_replicated: AtomicU64,
    pub pipelines: AtomicU64,
    pub pipelines_in_flight: AtomicU64,
    pub batches: AtomicU64,
    pub redirects_moved: AtomicU64,
    pub redirects_ask: AtomicU64,
    pub cluster_retries: AtomicU64,
    /// The facade's handles, updated next to the counters above. Records nothing in `Stats::default()`.
    pub metrics: ProducerMetrics,
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

impl Stats {
    /// Counters from zero, and metrics labelled with `stream` in the recorder installed now.
    pub(crate) fn new(stream: &StreamName) -> Self {
        Stats {
            metrics: ProducerMetrics::new(stream),
            ..Stats::default()
        }
    }

    pub(crate) fn snapshot(&self) -> ProducerStats {
        ProducerStats {
            routing_version: None,
            shard_count: None,
            lease_remaining: None,
            routing_age: None,
            max_observed_version: RoutingVersion(0),
            refreshes: get(&self.refreshes),
            refresh_failures: get(&self.refresh_failures),
            routing_updates: get(&self.routing_updates),
            sync_metadata_responses: get(&self.sync_metadata_responses),
            routing_rollbacks: get(&self.routing_rollbacks),
            ignored_older_responses: get(&self.ignored_older_responses),
            version_store_failures: get(&self.version_store_failures),
            routing_refusals: get(&self.routing_refusals),
            records_written: get(&self.records_written),
            records_not_written: get(&self.records_not_written),
            records_unknown: get(&self.records_unknown),
            records_not_replicated: get(&self.records_not_replicated),
            pipelines: get(&self.pipelines),
            pipelines_in_flight: get(&self.pipelines_in_flight),
            batches: get(&self.batches),
            redirects_moved: get(&self.redirects_moved),
            redirects_ask: get(&self.redirects_ask),
            cluster_retries: get(&self.cluster_retries),
            queued: 0,
        }
    }
}

/// A point-in-time copy of a producer's counters and routing state ([`Producer::stats`](crate::Producer::stats)).
///
/// ```
/// # fn example(producer: &stream_producer::Producer) {
/// let stats = producer.stats();
/// let outcomes = stats.records_written + stats.records_not_written + stats.records_unknown;
/// if stats.refresh_failures > 0 {
///     eprintln!("{} routing refreshes failed; lease left {:?}", stats.refresh_failures, stats.lease_remaining);
/// }
/// println!("{} of {outcomes} records written", stats.records_written);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProducerStats {
    /// The routing version in use, when the lease is valid.
    pub routing_version: Option<RoutingVersion>,
    /// The shard count in use, when the lease is valid.
    pub shard_count: Option<u32>,
    /// How long the routing lease still holds, when it is valid.
    pub lease_remaining: Option<Duration>,
    /// Time since the refresh that last returned or renewed the routing was sent, when the lease is valid.
    pub routing_age: Option<Duration>,
    /// The highest routing version ever observed (what every refresh reports).
    pub max_observed_version: RoutingVersion,
    /// Successful refreshes (`OK` or `SYNC_METADATA`).
    pub refreshes: u64,
    /// Failed refreshes (coordinator unreachable or answering an error).
    pub refresh_failures: u64,
    /// Times a newer routing version replaced the cache (including the first fetch).
    pub routing_updates: u64,
    /// `SYNC_METADATA` answers (the producer reported a version above what Redis stores).
    pub sync_metadata_responses: u64,
    /// `SYNC_METADATA` answers that changed the routing in use (a rollback adopted).
    pub routing_rollbacks: u64,
    /// `OK` answers older than the routing in use, ignored.
    pub ignored_older_responses: u64,
    /// Failed writes to the version store.
    pub version_store_failures: u64,
    /// Publishes refused for lack of a valid routing (fail closed).
    pub routing_refusals: u64,
    /// Records written to a shard stream.
    pub records_written: u64,
    /// Records that failed and are known not to be written.
    pub records_not_written: u64,
    /// Records whose outcome is unknown (connection dropped mid-pipeline, or not confirmed by enough replicas).
    pub records_unknown: u64,
    /// Of [`records_unknown`](Self::records_unknown): records a durable producer saw written on the master but not
    /// confirmed by enough replicas in time ([`PublishError::NotReplicated`](crate::PublishError::NotReplicated)).
    pub records_not_replicated: u64,
    /// Pipelines sent to Redis: one per shard per batch; for the fenced producer on one server, one per checked
    /// transaction (its fence check), which carries the batches of several shards of one lane.
    pub pipelines: u64,
    /// Pipelines waiting for Redis's answer now.
    pub pipelines_in_flight: u64,
    /// Batches the batching mode has sent.
    pub batches: u64,
    /// On a Redis Cluster: commands answered `MOVED` (they did not run) and sent again to the slot's new master.
    pub redirects_moved: u64,
    /// On a Redis Cluster: commands answered `ASK` (their slot is migrating) and sent again to the importing node.
    pub redirects_ask: u64,
    /// On a Redis Cluster: commands sent again after `TRYAGAIN`, `CLUSTERDOWN` or an unreachable node.
    pub cluster_retries: u64,
    /// Records accepted by `enqueue` and not sent yet (the open batch and the sealed ones waiting for the in-flight
    /// budget): at most `queue_capacity`.
    pub queued: usize,
}

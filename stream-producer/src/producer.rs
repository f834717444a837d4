//! The producer handle: owns the routing refresher and the batcher tasks, and exposes the publishing calls.
//!
//! # Ordering contract of a publish
//! 1. Ask the routing cache for a routing valid *now*. If the lease ended, or a newer version is known to exist,
//!    refresh first (single flight, shared with every concurrent publish and the background refresher).
//! 2. If there is still no valid routing, fail every record with
//!    [`PublishError::RoutingExpired`] (or `NoRouting`) and write nothing.
//! 3. Otherwise choose each record's shard with that routing, group by shard and send one pipeline per shard.
//! 4. Report each record as written, not written or unknown.
//!
//! # Starting
//! [`ProducerBuilder::build`](crate::ProducerBuilder::build) is inert, like the consumer's: it checks the
//! settings and builds the clients, and neither spawns a task nor does I/O, so it works outside a tokio runtime.
//! The background tasks (routing refresher, batcher) start the first time the producer is used in a runtime:
//! [`Producer::ready`] (the explicit start, which also waits for the first routing and the Redis connections),
//! or the first publish, enqueue or flush. Reading [`Producer::routing`] or [`Producer::stats`] starts nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use client_core::{CoordClient, SharedVersionStore};
use protocol::names::StreamName;
use protocol::RoutingVersion;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batcher::{self, Accumulator, Delivery};
use crate::config::ProducerConfig;
use crate::error::{BatchError, ConfigError, ProducerError, PublishError, RecordOutcome};
use crate::published::Published;
use crate::publisher::Publisher;
use crate::record::Record;
use crate::refresher::Refresher;
use crate::routed_publisher::{RerouteWait, RoutedPublisher};
use crate::routing_cache::{RetryPolicy, RoutingCache, RoutingInfo};
use crate::stats::{ProducerStats, Stats};
use crate::write_path::WritePath;

/// Where the producer's tasks are: not spawned yet, running, or taken by `close`.
#[derive(Debug)]
enum Tasks {
    Idle,
    Running(JoinHandle<()>),
    Closed,
}

/// A producer for one stream: routes records to its shards with a leased routing cache and writes them with
/// pipelined `XADD`s.
///
/// Built with [`Producer::builder`]. All publishing methods take `&self`; share a producer between tasks with an
/// `Arc`. Close it with [`close`](Self::close), which loses nothing already accepted. Dropping it without
/// `close` only cancels its tasks (a destructor cannot wait): queued records fail as not written and the
/// outcome of records in flight becomes unknown.
///
/// # Example
/// Shared by request handlers; a failed publish says whether retrying it is safe:
/// ```no_run
/// use std::sync::Arc;
/// use stream_producer::{Producer, PublishError, WriteState};
///
/// async fn order_created(producer: &Producer, customer: &str, cents: u64) -> Result<(), PublishError> {
///     let fields = [("type", "order-created".to_owned()), ("cents", cents.to_string())];
///     match producer.send(customer, &fields).await {
///         // Not in Redis: sending it again cannot duplicate it.
///         Err(e) if e.write_state() == WriteState::NotWritten => producer.send(customer, &fields).await.map(drop),
///         // Written, or maybe written (a retry could duplicate it): let the caller decide.
///         other => other.map(drop),
///     }
/// }
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let producer = Arc::new(
///     Producer::builder("orders")
///         .coordinator("http://coordinator:7400")
///         .redis("redis://redis:6379")
///         .build()?,
/// );
/// let shared = Arc::clone(&producer);
/// tokio::spawn(async move { order_created(&shared, "customer-42", 1250).await.ok() }).await?;
///
/// // Once the other tasks dropped their clones: wait for every accepted record's outcome.
/// if let Ok(producer) = Arc::try_unwrap(producer) {
///     let stats = producer.close().await?;
///     println!("{} records written", stats.records_written);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Producer {
    config: ProducerConfig,
    shared: Arc<RoutedPublisher>,
    /// The batching mode's accumulator; closing it (in `close`) lets the batcher drain it and exit.
    accumulator: Arc<Accumulator>,
    /// Cancels the refresher, and the batcher when the producer is dropped without `close`.
    cancel: CancellationToken,
    /// Every task the producer spawned.
    tasks: TaskTracker,
    /// Set once the tasks are spawned: the publish path checks it with one load instead of taking `batcher`'s
    /// lock.
    started: AtomicBool,
    /// The batcher: nothing until the first use, then its handle, awaited first by `close` (it still needs
    /// the refresher to publish what is queued).
    batcher: Mutex<Tasks>,
}

impl Producer {
    /// Builds the clients and the queue; spawns nothing (see "Starting" in the module docs).
    pub(crate) fn new(config: ProducerConfig, store: SharedVersionStore) -> Result<Producer, ConfigError> {
        let stats = Arc::new(Stats::new(&config.stream));
        let client = CoordClient::with_tls(
            config.coordinator_urls.clone(),
            config.coordinator_timeout,
            config.coordinator_token.clone(),
            &config.coordinator_tls,
        )
        .map_err(ConfigError::CoordinatorClient)?;
        let cache = RoutingCache::new(RetryPolicy {
            min: config.refresh_retry_min,
            max: config.refresh_retry_max,
        });
        let refresher = Arc::new(Refresher::new(
            config.stream.clone(),
            Arc::new(client),
            store,
            cache,
            config.coordinator_timeout,
            stats.clone(),
        ));
        let publisher = Publisher::new(WritePath::new(&config, stats.clone())?, stats.clone());
        let shared = Arc::new(RoutedPublisher {
            refresher: refresher.clone(),
            publisher,
            stats,
            reroute: config.reroute_fenced.then_some(RerouteWait {
                first: config.refresh_retry_min,
                longest: config.refresh_retry_max,
                within: config.coordinator_timeout,
            }),
        });
        let accumulator = Arc::new(Accumulator::new(config.batching));
        Ok(Producer {
            config,
            shared,
            accumulator,
            cancel: CancellationToken::new(),
            tasks: TaskTracker::new(),
            started: AtomicBool::new(false),
            batcher: Mutex::new(Tasks::Idle),
        })
    }

    /// Spawns the refresher and the batcher on the current runtime, once. Every path that needs them (a publish,
    /// an enqueue, a flush, `ready`) calls this first; they all run inside a runtime because they are async.
    fn start_tasks(&self) {
        if self.started.load(Ordering::Acquire) {
            return;
        }
        let mut slot = self
            .batcher
            .lock()
            .expect("the task slot lock is never held across a panic");
        match std::mem::replace(&mut *slot, Tasks::Closed) {
            Tasks::Idle => {
                self.tasks
                    .spawn(self.shared.refresher.clone().run(self.cancel.child_token()));
                let batcher = batcher::run(self.shared.clone(), self.accumulator.clone(), self.cancel.child_token());
                *slot = Tasks::Running(self.tasks.spawn(batcher));
                self.started.store(true, Ordering::Release);
            }
            // Another caller started them between the load above and the lock.
            running => *slot = running,
        }
    }

    /// The stream this producer publishes to.
    pub fn stream(&self) -> &StreamName {
        &self.config.stream
    }

    /// The idempotent producer's id (given, or drawn at build), when idempotence is on.
    pub fn producer_id(&self) -> Option<&str> {
        self.shared.publisher.producer_id()
    }

    /// The settings the producer was built with.
    pub fn config(&self) -> &ProducerConfig {
        &self.config
    }

    /// Starts the producer's tasks if they are not running yet, then waits until the producer holds a valid
    /// routing (fetching it now if needed) and its Redis connections are open: the explicit start, which
    /// surfaces a wrong coordinator or Redis before the first record. Optional: the first publish does the same
    /// on its own.
    ///
    /// A retryable coordinator answer (unreachable, `503 STORE_UNAVAILABLE` while the coordinator's Redis
    /// restarts, `COORDINATOR_TERMINATING`, `RATE_LIMITED`) is retried on the refresh backoff for up to
    /// `coordinator_timeout` from the call; a final one (`401`, `404 NOT_FOUND`, `400`) fails at once.
    ///
    /// # Errors
    /// [`PublishError::NoRouting`] / [`PublishError::RoutingExpired`] when no routing can be fetched (its
    /// `last_error` is the last refresh failure),
    /// [`PublishError::Connect`] when Redis cannot be reached, [`PublishError::RedisUnsupported`] when it is too
    /// old or lacks a command the producer sends (checked on the first connection).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn ready(&self) -> Result<RoutingInfo, PublishError> {
        self.start_tasks();
        let routing = self.shared.refresher.routing_for_ready().await?;
        self.shared
            .publisher
            .connect_all()
            .await
            .map_err(|f| f.into_publish_error(protocol::ShardId(0)))?;
        Ok(routing)
    }

    /// Publishes one record routed by `key` and waits for Redis's answer.
    ///
    /// Concurrent calls share the publishing connections, which pipeline them; for many records at once use
    /// [`send_batch`](Self::send_batch) or [`enqueue`](Self::enqueue).
    ///
    /// ```no_run
    /// # async fn example(producer: &stream_producer::Producer) -> Result<(), stream_producer::PublishError> {
    /// let published = producer.send("customer-42", &[("type", "order-created"), ("amount", "12.50")]).await?;
    /// println!("shard {} id {}", published.shard, published.id);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`PublishError`]; its [`write_state`](PublishError::write_state) says whether the record may be in Redis.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future after the request left leaves the record's outcome unknown.
    pub async fn send<K, N, V>(&self, key: K, fields: &[(N, V)]) -> Result<Published, PublishError>
    where
        K: AsRef<[u8]>,
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let record = Record::new(
            Some(key.as_ref().to_vec()),
            fields.iter().map(|(n, v)| (n.as_ref().to_vec(), v.as_ref().to_vec())),
        );
        self.send_record(record).await
    }

    /// Publishes one record (with or without a key) and waits for Redis's answer.
    ///
    /// # Errors
    /// [`PublishError`], as for [`send`](Self::send).
    ///
    /// # Cancel safety
    /// Not cancel safe, as for [`send`](Self::send).
    pub async fn send_record(&self, record: Record) -> Result<Published, PublishError> {
        record.check()?;
        self.start_tasks();
        self.shared
            .publish_checked(std::slice::from_ref(&record))
            .await
            .pop()
            .expect("one result per record")
    }

    /// Publishes records in one round trip per shard: groups them by shard and sends one pipeline of `XADD`s per
    /// shard, the shards' pipelines concurrently. The whole batch uses one routing.
    ///
    /// Records of one key keep their order. Records without a key go round-robin.
    ///
    /// # Errors
    /// [`BatchError`] when any record was not written, with one [`RecordOutcome`] per record (in input order),
    /// so exactly the not-written ones can be sent again.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future after pipelines left leaves their records' outcome unknown.
    pub async fn send_batch(&self, records: Vec<Record>) -> Result<Vec<Published>, BatchError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        self.start_tasks();
        let mut outcomes: Vec<Option<Result<Published, PublishError>>> = Vec::with_capacity(records.len());
        let mut valid = Vec::with_capacity(records.len());
        let mut valid_at = Vec::with_capacity(records.len());
        for (i, r) in records.into_iter().enumerate() {
            match r.check() {
                Ok(()) => {
                    valid.push(r);
                    valid_at.push(i);
                    outcomes.push(None);
                }
                Err(e) => outcomes.push(Some(Err(e))),
            }
        }
        if !valid.is_empty() {
            let results = self.shared.publish_checked(&valid).await;
            for (i, r) in valid_at.into_iter().zip(results) {
                outcomes[i] = Some(r);
            }
        }
        let outcomes: Vec<Result<Published, PublishError>> = outcomes
            .into_iter()
            .map(|o| o.expect("every record has an outcome"))
            .collect();
        if outcomes.iter().all(Result::is_ok) {
            Ok(outcomes.into_iter().filter_map(Result::ok).collect())
        } else {
            Err(BatchError::new(
                outcomes.into_iter().map(RecordOutcome::from_result).collect(),
            ))
        }
    }

    /// Hands a record to the background batching mode and returns once it is *accepted* (queued); the returned
    /// [`Delivery`] resolves to its outcome once its batch was written.
    ///
    /// The calling task appends the record to the open batch itself (no message to another task). When
    /// `queue_capacity` records are accepted and not sent yet, this waits for room (backpressure).
    ///
    /// ```no_run
    /// # async fn example(producer: &stream_producer::Producer) -> Result<(), Box<dyn std::error::Error>> {
    /// use stream_producer::Record;
    ///
    /// let mut deliveries = Vec::new();
    /// for i in 0..1000 {
    ///     deliveries.push(producer.enqueue(Record::with_key(format!("k{i}")).field("n", i.to_string())).await?);
    /// }
    /// for d in deliveries {
    ///     d.await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`PublishError::InvalidRecord`], or [`PublishError::Closed`] when the batcher is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped while waiting for room, the record was not accepted.
    pub async fn enqueue(&self, record: Record) -> Result<Delivery, PublishError> {
        record.check()?;
        self.start_tasks();
        self.accumulator.append(record).await
    }

    /// Waits until every record accepted by [`enqueue`](Self::enqueue) before this call has its outcome (written
    /// or failed). Records enqueued concurrently with the flush may or may not be included.
    ///
    /// # Errors
    /// [`ProducerError::Closed`] when the batcher is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future only stops waiting.
    pub async fn flush(&self) -> Result<(), ProducerError> {
        self.start_tasks();
        let done = self.accumulator.flush().ok_or(ProducerError::Closed)?;
        done.await.map_err(|_| ProducerError::Closed)
    }

    /// The routing usable now, if the lease holds.
    pub fn routing(&self) -> Option<RoutingInfo> {
        self.shared.refresher.current()
    }

    /// Tells the producer that routing version `version` exists (for example from a consumer heartbeat, or an
    /// operator tool that just added shards). When it is newer than the version in use, the producer refreshes
    /// at once, and publishes wait for that refresh (or its failure) instead of using the old shard count.
    pub fn observe_routing_version(&self, version: RoutingVersion) {
        self.shared.refresher.hint_newer_version(version);
    }

    /// A snapshot of the producer's counters and routing state.
    pub fn stats(&self) -> ProducerStats {
        let mut s = self.shared.stats.snapshot();
        if let Some(r) = self.routing() {
            s.routing_version = Some(r.version);
            s.shard_count = Some(r.shard_count);
            s.lease_remaining = Some(r.lease_remaining);
            s.routing_age = Some(r.age);
        }
        s.max_observed_version = self.shared.refresher.max_observed();
        s.queued = self.accumulator.queued();
        s
    }

    /// Closes the producer gracefully: stops accepting records, publishes everything already queued and waits
    /// for every outcome (each [`Delivery`] resolves), then stops the refresher and joins every task. Returns the
    /// final counters.
    ///
    /// Nothing accepted is lost: a queued record is either written or its `Delivery` reports why not. How long
    /// this takes is bounded by the Redis response timeout per batch (and by the routing: without a valid
    /// routing, queued records fail fast as not written).
    ///
    /// A producer that was never used has no task to join: closing it only persists the highest observed
    /// routing version.
    ///
    /// # Errors
    /// [`ProducerError::TaskFailed`] when a task panicked (its [`JoinError`](tokio::task::JoinError) is the
    /// source).
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future cancels the tasks like dropping the producer does.
    pub async fn close(mut self) -> Result<ProducerStats, ProducerError> {
        // The batcher sends what was accepted, then exits.
        self.accumulator.close();
        let mut failure = None;
        let batcher = std::mem::replace(
            self.batcher
                .get_mut()
                .expect("the task slot lock is never held across a panic"),
            Tasks::Closed,
        );
        if let Tasks::Running(batcher) = batcher {
            if let Err(e) = batcher.await {
                failure = Some(ProducerError::TaskFailed(e));
            }
        }
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        self.shared.refresher.flush_versions().await;
        let stats = self.stats();
        match failure {
            Some(e) => Err(e),
            None => Ok(stats),
        }
    }

    /// How long the routing lease still holds, if it does.
    pub fn lease_remaining(&self) -> Option<Duration> {
        self.routing().map(|r| r.lease_remaining)
    }
}

impl Drop for Producer {
    /// Cancels the producer's tasks without waiting (a destructor cannot await). Use [`Producer::close`] to lose
    /// nothing.
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

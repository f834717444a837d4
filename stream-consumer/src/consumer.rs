//! The consumer: [`Consumer`] (built, not running), [`Consumer::run`] to run it in the current task until a
//! token is cancelled, or [`Consumer::spawn`] to run it in the background behind a [`ConsumerHandle`].

use protocol::names::MemberId;
use protocol::MetadataVersion;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::ConsumerConfig;
use crate::error::ConsumerError;
use crate::handler::{DynHandler, DynListener, NoListener};
use crate::lease::LeaseView;
use crate::metrics::ConsumerMetrics;
use crate::redis_check::check_redis;
use crate::shard_reader::ReaderShared;
use crate::status::{CloseReport, ConsumerStatus};
use crate::supervisor::Driver;
use client_core::membership::Membership;
use client_core::version_store::group_version_key as version_key;
use client_core::SharedVersionStore;
use client_core::{CoordClient, CoordTransport, PersistPolicy, VersionPersister};

/// A consumer group member, configured and not yet running.
///
/// Build it with [`Consumer::builder`], then either [`run`](Consumer::run) it in the current task until a
/// cancellation token fires, or [`spawn`](Consumer::spawn) it and keep the [`ConsumerHandle`].
///
/// # Example
/// Started in the background (the crate root shows [`run`](Consumer::run) in the current task):
/// ```no_run
/// use stream_consumer::{Consumer, Message};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let consumer = Consumer::builder("orders", "billing")
///     .coordinator("http://coordinator:7400")
///     .redis("redis://redis:6379")
///     .handler(|msg: Message| async move {
///         println!("shard {} entry {}", msg.shard(), msg.id());
///         Ok::<_, std::io::Error>(())
///     })
///     .build()?;
/// // Fails here, before joining the group, when Redis is unreachable, older than 6.2 or lacks a command.
/// let handle = consumer.start().await?;
///
/// tokio::signal::ctrl_c().await?;
/// println!("reading shards {:?} at shutdown", handle.status().reading);
/// // Graceful: in-flight entries finish, shards are reported revoked, the group is left.
/// let report = handle.close().await?;
/// assert!(report.killed_shards.is_empty());
/// # Ok(())
/// # }
/// ```
pub struct Consumer {
    config: Arc<ConsumerConfig>,
    handler: Arc<dyn DynHandler>,
    listener: Arc<dyn DynListener>,
    store: SharedVersionStore,
    /// Random per process: tells the coordinator a retried join from a new incarnation of the member id.
    instance_id: String,
    status: watch::Sender<ConsumerStatus>,
    /// Registered at build time, with the recorder the application installed before (see [`crate::metrics`]).
    metrics: ConsumerMetrics,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("config", &self.config)
            .field("instance_id", &self.instance_id)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    pub(crate) fn from_parts(
        config: ConsumerConfig,
        handler: Arc<dyn DynHandler>,
        listener: Option<Arc<dyn DynListener>>,
        store: Option<SharedVersionStore>,
    ) -> Consumer {
        let status = watch::Sender::new(ConsumerStatus::initial(config.member_id.clone()));
        let metrics = ConsumerMetrics::new(&config.stream, &config.group);
        Consumer {
            config: Arc::new(config),
            handler,
            listener: listener.unwrap_or_else(|| Arc::new(NoListener)),
            store: store.unwrap_or_else(SharedVersionStore::process_default),
            instance_id: format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>()),
            status,
            metrics,
        }
    }

    /// The validated configuration.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// The member id (configured or generated).
    pub fn member_id(&self) -> &MemberId {
        &self.config.member_id
    }

    /// This process's instance id (random, sent with every heartbeat).
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// A receiver of the consumer's [`ConsumerStatus`], updated after every change. Take it before
    /// [`run`](Consumer::run) consumes the consumer.
    pub fn status(&self) -> watch::Receiver<ConsumerStatus> {
        self.status.subscribe()
    }

    /// Runs the consumer in the current task until `shutdown` is cancelled, then closes it gracefully: stop new
    /// reads, finish in-flight work (up to the drain timeout), report every shard revoked, leave the group so its
    /// shards move at once.
    ///
    /// # Errors
    /// [`ConsumerError::VersionStore`] when the version store cannot be read at start;
    /// [`ConsumerError::RedisUnusable`] when the shard streams' Redis cannot be reached, is older than 6.2 or
    /// lacks a command the consumer needs (checked before joining, so a wrong URL never holds shards);
    /// [`ConsumerError::Coordinator`] when the coordinator refuses the first join for a reason retrying cannot
    /// fix (bad token, invalid request). Coordinator outages and Redis errors are not errors: the consumer
    /// retries them for as long as it runs.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future stops every task at once, like a crash (no leave; the coordinator
    /// moves the shards when the member TTL runs out). Cancel `shutdown` instead.
    pub async fn run(self, shutdown: CancellationToken) -> Result<CloseReport, ConsumerError> {
        self.run_with(shutdown, CancellationToken::new(), false, None).await
    }

    /// Checks the shard streams' Redis (see [`run`](Consumer::run)), then runs the consumer on a background task
    /// and returns its handle: unlike [`spawn`](Consumer::spawn), a Redis that cannot be used fails here, before
    /// the member joins.
    ///
    /// # Errors
    /// [`ConsumerError::RedisUnusable`] (or [`ConsumerError::Redis`]) when Redis fails the check.
    pub async fn start(self) -> Result<ConsumerHandle, ConsumerError> {
        let (_, nodes) = crate::redis_nodes::open(&self.config.redis_url, self.config.timings.redis_response_timeout)
            .map_err(ConsumerError::Redis)?;
        check_redis(&nodes, &self.config).await?;
        Ok(self.spawn_checked(true))
    }

    /// Runs the consumer on a background task and returns its handle. The Redis check runs on that task: if it
    /// fails, the consumer stops with [`ConsumerError::RedisUnusable`] without joining (see
    /// [`ConsumerHandle::close`]); use [`start`](Consumer::start) to get that error at once.
    ///
    /// Must be called inside a Tokio runtime.
    pub fn spawn(self) -> ConsumerHandle {
        self.spawn_checked(false)
    }

    fn spawn_checked(self, checked: bool) -> ConsumerHandle {
        self.spawn_on(checked, None)
    }

    /// Runs the consumer against `transport` instead of the coordinator's HTTP API, without the Redis start-up
    /// check (the tests of the supervisor's schedules, under paused time).
    #[cfg(test)]
    pub(crate) fn spawn_with_transport(self, transport: Arc<dyn CoordTransport>) -> ConsumerHandle {
        self.spawn_on(true, Some(transport))
    }

    /// Spawns the consumer with the coordinator `transport` (the HTTP client when `None`).
    fn spawn_on(self, checked: bool, transport: Option<Arc<dyn CoordTransport>>) -> ConsumerHandle {
        let shutdown = CancellationToken::new();
        let kill = CancellationToken::new();
        let status = self.status();
        let member_id = self.config.member_id.clone();
        let task = tokio::spawn(self.run_with(shutdown.clone(), kill.clone(), checked, transport));
        ConsumerHandle {
            member_id,
            shutdown,
            kill,
            status,
            task: Some(task),
        }
    }

    async fn run_with(
        self,
        shutdown: CancellationToken,
        kill: CancellationToken,
        checked: bool,
        transport: Option<Arc<dyn CoordTransport>>,
    ) -> Result<CloseReport, ConsumerError> {
        let c = &self.config;
        let key = version_key(&c.stream, &c.group);
        let max_observed = self.store.load(&key).await?;
        // Lazy: Redis being down at start is an outage to ride out, not a start failure.
        let (conn, redis) =
            crate::redis_nodes::open(&c.redis_url, c.timings.redis_response_timeout).map_err(ConsumerError::Redis)?;
        if !checked {
            check_redis(&redis, c).await?;
        }
        let shared = Arc::new(ReaderShared {
            stream: c.stream.clone(),
            group: c.group.clone(),
            member_id: c.member_id.clone(),
            redis,
            conn,
            handler: Arc::clone(&self.handler),
            listener: Arc::clone(&self.listener),
            lease: Arc::new(LeaseView::new(crate::lease::now())),
            start_from: c.start_from,
            read_block: c.timings.read_block,
            batch_size: c.batch_size,
            max_deliveries: c.max_deliveries,
            retry_min: c.timings.retry_backoff_min,
            retry_max: c.timings.retry_backoff_max,
            reclaim_every: c.timings.member_ttl,
            metrics: self.metrics.clone(),
            listener_timeout: c.timings.listener_timeout,
        });
        let membership = Membership::new(
            c.member_id.clone(),
            self.instance_id.clone(),
            MetadataVersion(max_observed),
        );
        let persister = Arc::new(VersionPersister::spawn(
            self.store.clone(),
            key,
            max_observed,
            PersistPolicy::default(),
            Arc::new(self.metrics.clone()),
        ));
        let transport = match transport {
            Some(t) => t,
            None => Arc::new(
                CoordClient::with_tls(
                    c.coordinator_urls.clone(),
                    c.timings.request_timeout,
                    c.coordinator_token.clone(),
                    &c.coordinator_tls,
                )
                .map_err(ConsumerError::CoordinatorClient)?,
            ),
        };
        let driver = Driver {
            config: Arc::clone(&self.config),
            transport,
            shared,
            listener: Arc::clone(&self.listener),
            persister: Arc::clone(&persister),
            routing_observed: self.store.observed(c.stream.as_str()),
            membership,
            status: self.status.clone(),
            kill,
        };
        let closed = driver.run(shutdown).await;
        // So the next process starts from what this one saw (bounded: a failing store must not hold the close).
        if !persister.flush(PersistPolicy::default().attempt_timeout).await {
            tracing::warn!(group = %c.group, "closing with the highest observed metadata version not persisted");
        }
        closed
    }
}

/// A running consumer ([`Consumer::spawn`]). Owns the consumer's tasks.
///
/// Dropping the handle begins a graceful close in the background (it cannot wait for it); call
/// [`close`](ConsumerHandle::close) to wait for the close and learn how it went.
#[derive(Debug)]
pub struct ConsumerHandle {
    member_id: MemberId,
    shutdown: CancellationToken,
    kill: CancellationToken,
    status: watch::Receiver<ConsumerStatus>,
    task: Option<JoinHandle<Result<CloseReport, ConsumerError>>>,
}

impl ConsumerHandle {
    /// The member id.
    pub fn member_id(&self) -> &MemberId {
        &self.member_id
    }

    /// The current status.
    pub fn status(&self) -> ConsumerStatus {
        self.status.borrow().clone()
    }

    /// A receiver of status updates.
    pub fn watch_status(&self) -> watch::Receiver<ConsumerStatus> {
        self.status.clone()
    }

    /// Closes gracefully (see [`Consumer::run`]) and waits until every task stopped.
    ///
    /// # Errors
    /// The consumer's error, if it stopped with one, or [`ConsumerError::Task`] if its task panicked.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves the close running in the background.
    pub async fn close(mut self) -> Result<CloseReport, ConsumerError> {
        self.shutdown.cancel();
        let task = self
            .task
            .take()
            .expect("the task is taken only by close or abort, which consume the handle");
        task.await.map_err(ConsumerError::Task)?
    }

    /// Stops every task at once, like a crash: in-flight handlers are dropped, nothing is reported to the
    /// coordinator and the member does not leave, so its shards move only when the coordinator expires it (after
    /// the member TTL). Waits until the tasks stopped. Meant for tests and emergencies; use
    /// [`close`](ConsumerHandle::close) otherwise.
    pub async fn abort(mut self) {
        self.kill.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Whether the consumer has stopped (closed, aborted, or failed).
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for ConsumerHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

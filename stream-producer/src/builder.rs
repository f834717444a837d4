//! [`ProducerBuilder`]: the by-value builder behind [`Producer::builder`]. `build()` checks the settings
//! ([`ProducerConfig::validate`]) and starts nothing: the producer's tasks start when it is first used.

use std::time::Duration;

use protocol::names::StreamName;

use crate::config::{BatchingConfig, Durability, IdempotenceConfig, ProducerConfig, Trim};
use crate::error::ConfigError;
use crate::producer::Producer;

impl Producer {
    /// A builder for a producer of `stream`.
    pub fn builder(stream: impl Into<String>) -> ProducerBuilder {
        ProducerBuilder::new(stream)
    }
}

/// Builds a [`Producer`]: `Producer::builder(stream)`, then settings, then [`build`](Self::build).
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use stream_producer::{Producer, Trim};
///
/// let producer = Producer::builder("orders")
///     .coordinator("http://coord-a:7400")
///     .coordinator("http://coord-b:7400")
///     .redis("redis://127.0.0.1:6379")
///     .connections(4)
///     .trim(Trim::MaxLen(1_000_000))
///     .linger(Duration::from_millis(2))
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct ProducerBuilder {
    stream: String,
    config: ProducerConfig,
    version_store: Option<client_core::SharedVersionStore>,
    /// Whether `reroute_fenced` was called: the default (on) gives way to `fencing(false)`, an explicit `true`
    /// does not (`build` refuses it).
    reroute_set: bool,
}

impl ProducerBuilder {
    pub(crate) fn new(stream: impl Into<String>) -> Self {
        let stream = stream.into();
        // The name is checked in build(); a placeholder keeps the config typed until then.
        let placeholder = StreamName::new("unchecked").expect("a constant valid name");
        ProducerBuilder {
            stream,
            config: ProducerConfig::new(placeholder),
            version_store: None,
            reroute_set: false,
        }
    }

    /// Adds a coordinator base URL (repeat for several instances).
    pub fn coordinator(mut self, url: impl Into<String>) -> Self {
        self.config.coordinator_urls.push(url.into());
        self
    }

    /// Adds several coordinator base URLs.
    pub fn coordinators<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.config.coordinator_urls.extend(urls.into_iter().map(Into::into));
        self
    }

    /// Bearer token sent to the coordinator.
    pub fn coordinator_token(mut self, token: impl Into<String>) -> Self {
        self.config.coordinator_token = Some(token.into());
        self
    }

    /// TLS settings of `https://` coordinator URLs: a private CA ([`TlsOptions::ca_file`]), a client certificate
    /// for coordinators that require one. Without it the coordinator's certificate is verified against the
    /// system's roots. The files are read at `build()`.
    ///
    /// [`TlsOptions::ca_file`]: redis_link::TlsOptions::ca_file
    pub fn coordinator_tls(mut self, tls: redis_link::TlsOptions) -> Self {
        self.config.coordinator_tls = tls;
        self
    }

    /// Deadline of one routing request to one coordinator URL (default 2 s), and how long
    /// [`Producer::ready`](crate::Producer::ready) and the first publish retry a retryable refresh failure.
    pub fn coordinator_timeout(mut self, timeout: Duration) -> Self {
        self.config.coordinator_timeout = timeout;
        self
    }

    /// Where the shard streams live: one Redis URL (`redis://host:port/db`, `rediss://` for TLS), or a Redis
    /// Cluster as `cluster:` followed by the comma-separated URLs of some of its nodes (seeds; the other nodes
    /// are discovered):
    ///
    /// ```
    /// # use stream_producer::Producer;
    /// let producer = Producer::builder("orders")
    ///     .coordinator("http://coord-a:7400")
    ///     .redis("cluster:redis://:secret@10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379")
    ///     .build()
    ///     .expect("a valid cluster target");
    /// assert!(producer.config().is_cluster());
    /// ```
    ///
    /// On a cluster every node connection uses the first seed's credentials and TLS settings, and a seed must not
    /// select a database other than 0; `build` refuses a malformed target with
    /// [`ConfigError::InvalidRedisTarget`]. Each shard's pipeline goes straight to the master of its slot, with
    /// [`connections`](Self::connections) connections per master; redirects, failovers and slot migrations are
    /// followed per command, keeping every record's [`WriteState`](crate::WriteState) exact (docs/cluster.md,
    /// "Producer").
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.config.redis_url = url.into();
        self
    }

    /// Number of publishing connections (default 8; see [`ProducerConfig::connections`]).
    pub fn connections(mut self, n: usize) -> Self {
        self.config.connections = n;
        self
    }

    /// Deadline for opening a Redis connection (default 2 s).
    pub fn redis_connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.redis_connect_timeout = timeout;
        self
    }

    /// Deadline for Redis's answer to a pipeline (default 5 s).
    pub fn redis_response_timeout(mut self, timeout: Duration) -> Self {
        self.config.redis_response_timeout = timeout;
        self
    }

    /// Approximate trimming of every shard stream.
    pub fn trim(mut self, trim: Trim) -> Self {
        self.config.trim = Some(trim);
        self
    }

    /// All batching settings at once.
    pub fn batching(mut self, batching: BatchingConfig) -> Self {
        self.config.batching = batching;
        self
    }

    /// Queue capacity of the batching mode (default 10 000).
    pub fn queue_capacity(mut self, n: usize) -> Self {
        self.config.batching.queue_capacity = n;
        self
    }

    /// Largest batch of the batching mode (default 512).
    pub fn max_batch_size(mut self, n: usize) -> Self {
        self.config.batching.max_batch_size = n;
        self
    }

    /// Linger time of the batching mode (default 1 ms).
    pub fn linger(mut self, linger: Duration) -> Self {
        self.config.batching.linger = linger;
        self
    }

    /// Batches written concurrently by the batching mode (default 32; see [`BatchingConfig::max_in_flight_batches`]
    /// for the fenced producer). Records of one key enqueued one after another
    /// are written in that order whatever this is; only a re-send on a failure path (a fence re-route, see
    /// [`reroute_fenced`](Self::reroute_fenced), or a script reload after a Redis restart) can let a later batch
    /// pass an earlier one.
    pub fn max_in_flight_batches(mut self, n: usize) -> Self {
        self.config.batching.max_in_flight_batches = n;
        self
    }

    /// Bytes of records (keys, field names and values) the batching mode writes concurrently (default 64 MiB): a
    /// batch waits while this many are in flight; one batch may always go, whatever its size.
    pub fn max_in_flight_bytes(mut self, n: usize) -> Self {
        self.config.batching.max_in_flight_bytes = n;
        self
    }

    /// Backoff between failed routing refreshes: first `min`, doubling up to `max` (default 50 ms to 1 s).
    pub fn refresh_retry(mut self, min: Duration, max: Duration) -> Self {
        self.config.refresh_retry_min = min;
        self.config.refresh_retry_max = max;
        self
    }

    /// Whether every publish is fenced (default on): checked against the shard's fence atomically with the writes
    /// (a `WATCH`ed transaction, or the publish script; see `docs/producer.md`). Off: plain pipelined `XADD`s, as
    /// before the fence existed; a producer that missed a reshard then keeps writing keys to shards they left.
    pub fn fencing(mut self, on: bool) -> Self {
        self.config.fencing = on;
        self
    }

    /// Re-route and retry records refused by a shard fence (default on; it was off until issue 42). A fence
    /// refuses a batch as a whole before anything of it is written, so sending the records again cannot duplicate
    /// them; without it a producer drops the records a growth (`coordctl add-shards`) refused unless its caller
    /// sends them again.
    ///
    /// On: the producer refreshes its routing, chooses the refused records' shards again and sends them again
    /// (up to 3 times) before the publish call returns. A growth seals its parents before the coordinator serves
    /// the routing that lists its children, so a refresh may still bring the old routing: the producer then asks
    /// again, backing off from `refresh_retry_min` to `refresh_retry_max`, for at most `coordinator_timeout` before
    /// the records fail fenced. Records of one key from one producer stay in order iff no
    /// later record of that key is handed to the producer while an earlier one's call has not returned: sequential
    /// `send`s, all of them in one `send_batch`, or the batching mode with `max_in_flight_batches(1)`. With several
    /// calls in flight, a later call that routes with the new routing can be written before an earlier refused call
    /// is sent again.
    ///
    /// Off: refused records fail with [`PublishError::Fenced`](crate::PublishError::Fenced), not written, and
    /// the producer refreshes its routing at once, so the caller's next send goes to the new shard. Off is also
    /// what [`fencing(false)`](Self::fencing) implies when this is not called (nothing is refused without a
    /// fence); calling `reroute_fenced(true)` with fencing off is refused by `build`
    /// ([`ConfigError::ScriptRequired`]).
    pub fn reroute_fenced(mut self, on: bool) -> Self {
        self.config.reroute_fenced = on;
        self.reroute_set = true;
        self
    }

    /// The idempotent producer (default off), like Kafka's `enable.idempotence`: every record gets a per-shard
    /// sequence number, checked by the publish script, and a call whose outcome is unknown (connection lost or
    /// timed out) is retried by the producer with the same numbers; a retry of a call that was written answers
    /// with the original entry ids ([`Published::duplicate`](crate::Published::duplicate)) instead of writing the
    /// records twice. The producer then sends at most one call per shard at a time (calls to different shards
    /// still go concurrently). Settings: [`IdempotenceConfig`].
    pub fn idempotence(mut self, on: bool) -> Self {
        self.config.idempotence = on.then(|| self.config.idempotence.take().unwrap_or_default());
        self
    }

    /// The idempotent producer's id (turns idempotence on); see [`IdempotenceConfig::producer_id`].
    pub fn producer_id(mut self, id: impl Into<String>) -> Self {
        self.idempotence_settings().producer_id = Some(id.into());
        self
    }

    /// How long an idle idempotent producer's state stays in Redis (turns idempotence on); see
    /// [`IdempotenceConfig::idle_expiry`].
    pub fn producer_idle_expiry(mut self, expiry: Duration) -> Self {
        self.idempotence_settings().idle_expiry = expiry;
        self
    }

    /// Retries of an idempotent call whose outcome is unknown (turns idempotence on); see
    /// [`IdempotenceConfig::max_retries`].
    pub fn idempotence_retries(mut self, retries: u32) -> Self {
        self.idempotence_settings().max_retries = retries;
        self
    }

    fn idempotence_settings(&mut self) -> &mut IdempotenceConfig {
        self.config.idempotence.get_or_insert_with(IdempotenceConfig::default)
    }

    /// All idempotence settings at once (turns idempotence on).
    pub fn idempotence_config(mut self, config: IdempotenceConfig) -> Self {
        self.config.idempotence = Some(config);
        self
    }

    /// What [`Written`](crate::WriteState::Written) means (default [`Durability::Primary`]: the master executed the
    /// write). In the spirit of Kafka's `acks=all` with `min.insync.replicas`:
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use stream_producer::{Durability, Producer, PublishError, WriteState};
    ///
    /// let producer = Producer::builder("orders")
    ///     .coordinator("http://coord-a:7400")
    ///     .redis("redis://127.0.0.1:6379")
    ///     .durability(Durability::replicas(1, Duration::from_millis(500)))
    ///     .build()?;
    /// match producer.send("customer-42", &[("type", "order-created")]).await {
    ///     Ok(p) => println!("on the master and at least one replica: {}", p.id),
    ///     Err(e @ PublishError::NotReplicated { .. }) => {
    ///         // On the master, not confirmed by a replica within 500 ms: a failover may lose it.
    ///         assert_eq!(e.write_state(), WriteState::Unknown);
    ///     }
    ///     Err(e) => println!("{e}"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// With [`Durability::Replicas { min, timeout }`](Durability::Replicas) every write of the producer (plain
    /// `XADD`s, the checked transaction, the publish script, on one server or a Redis Cluster) is followed by
    /// `WAIT <min> <timeout ms>` on the same connection, in the same request (no extra round trip): Written then
    /// means the master executed the write *and* at least `min` of its replicas confirmed it, so a failover to one
    /// of them keeps it. When fewer confirm within `timeout` the records come back as
    /// [`PublishError::NotReplicated`](crate::PublishError::NotReplicated), whose write state is
    /// [`Unknown`](crate::WriteState::Unknown): they are on the master and may or may not survive it. Records that
    /// were not written (fenced, refused) stay [`NotWritten`](crate::WriteState::NotWritten).
    ///
    /// **Cost.** Each request waits for the replicas' acknowledgement (about one round trip from the master to a
    /// replica after the write), and `WAIT` blocks its connection meanwhile, so requests queued behind it on the
    /// same connection wait too. With many calls in flight this hardly shows: `producer_bench` (a replica on the
    /// same 2 cores, 32 callers) measured the durable modes at 0.93 to 1.06 of the same modes without durability.
    /// One call at a time pays the acknowledgement per call: plain `XADD`s at 0.85 of their non-durable rate, the
    /// checked transaction at 0.34 to 0.75 (BENCHMARKS.md, issue 30). When the replicas do not answer, every
    /// request of a connection waits the full `timeout` in turn; requests queued behind it may then reach the
    /// [`redis_response_timeout`](Self::redis_response_timeout) and come back as
    /// [`ConnectionLost`](crate::PublishError::ConnectionLost) (also Unknown).
    ///
    /// `build` checks `min >= 1` and `1 ms <= timeout <= 60 s`
    /// ([`ConfigError::OutOfRange`]) and `timeout < redis_response_timeout`
    /// ([`ConfigError::ReplicaWaitNotBelowResponseTimeout`]). The first connection to each server also checks that
    /// `WAIT` is there (not renamed). See `docs/producer.md`, "Durable writes".
    pub fn durability(mut self, durability: Durability) -> Self {
        self.config.durability = durability;
        self
    }

    /// Where the highest routing version ever observed is kept (key: the stream name). Default: the process-wide
    /// memory ([`MemoryVersionStore::process`](client_core::MemoryVersionStore::process)), shared by every
    /// producer and consumer of the process, so a producer recreated in the same process still reports what an
    /// earlier one saw; a [`FileVersionStore`](client_core::FileVersionStore) lets a restarted process still
    /// report a rolled-back routing.
    pub fn version_store(mut self, store: impl client_core::VersionStore) -> Self {
        self.version_store = Some(client_core::SharedVersionStore::new(store));
        self
    }

    /// Checks the settings and builds the producer. Inert, like the consumer SDK's `ConsumerBuilder::build`: it
    /// spawns no task and does no I/O, so it works outside a tokio runtime. The refresher and the batcher start on the first use inside a runtime
    /// ([`Producer::ready`], the first publish, enqueue or flush; see "Starting" in [`crate::producer`]).
    ///
    /// # Errors
    /// [`ConfigError`] naming the first rule broken.
    pub fn build(mut self) -> Result<Producer, ConfigError> {
        self.settle_defaults();
        self.config.stream = StreamName::new(self.stream)?;
        self.config.validate()?;
        let store = self
            .version_store
            .unwrap_or_else(client_core::SharedVersionStore::process_default);
        Producer::new(self.config, store)
    }
}

impl ProducerBuilder {
    /// Resolves the defaults that depend on other settings, so the built config reads as what runs.
    fn settle_defaults(&mut self) {
        if !self.config.fencing && !self.reroute_set {
            self.config.reroute_fenced = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> ProducerBuilder {
        Producer::builder("orders")
            .coordinator("http://127.0.0.1:7400")
            .redis("redis://127.0.0.1:6379")
    }

    fn check(mut b: ProducerBuilder) -> Result<(), ConfigError> {
        b.settle_defaults();
        let mut config = b.config;
        config.stream = StreamName::new(b.stream)?;
        config.validate()
    }

    #[test]
    fn defaults_are_valid() {
        check(ok()).unwrap();
    }

    #[test]
    fn debug_hides_the_token_and_redis_credentials() {
        let b = ok()
            .redis("redis://producer:hunter2@redis:6379")
            .coordinator_token("hunter3");
        let text = format!("{b:?}");
        assert!(!text.contains("hunter"), "{text}");
        assert!(text.contains("redis://***@redis:6379"), "{text}");
    }

    #[test]
    fn cluster_targets_are_checked() {
        check(ok().redis("cluster:redis://10.0.0.1:7000,redis://10.0.0.2:7001")).unwrap();
        for bad in [
            "cluster:",
            "cluster:redis://a:1,,redis://b:2",
            "cluster:nope://a:1",
            "cluster:redis://a:1/3",
        ] {
            assert!(
                matches!(check(ok().redis(bad)), Err(ConfigError::InvalidRedisTarget(_))),
                "{bad}"
            );
        }
        let b = ok().redis("cluster:redis://:hunter2@a:1,redis://:hunter4@b:2");
        let text = format!("{:?}", b.config);
        assert!(!text.contains("hunter"), "{text}");
    }

    #[test]
    fn rules_are_checked() {
        assert!(matches!(
            check(ok().connections(0)),
            Err(ConfigError::OutOfRange {
                setting: "connections",
                ..
            })
        ));
        assert!(matches!(
            check(Producer::builder("orders").redis("redis://x")),
            Err(ConfigError::MissingCoordinator)
        ));
        assert!(matches!(
            check(ok().coordinator("ftp://nope")),
            Err(ConfigError::InvalidCoordinatorUrl(_))
        ));
        assert!(matches!(
            check(Producer::builder("orders").coordinator("http://c")),
            Err(ConfigError::MissingRedisUrl)
        ));
        assert!(matches!(
            check(ok().redis("nope://x")),
            Err(ConfigError::InvalidRedisUrl { .. })
        ));
        assert!(matches!(
            check(Producer::builder("bad name{").coordinator("http://c")),
            Err(ConfigError::InvalidName(_))
        ));
        assert!(matches!(
            check(ok().queue_capacity(10).max_batch_size(20)),
            Err(ConfigError::QueueSmallerThanBatch { .. })
        ));
        assert!(matches!(
            check(ok().refresh_retry(Duration::from_secs(2), Duration::from_secs(1))),
            Err(ConfigError::RetryBackoffInverted { .. })
        ));
        assert!(matches!(
            check(ok().trim(Trim::MaxLen(0))),
            Err(ConfigError::OutOfRange { .. })
        ));
        assert!(matches!(
            check(ok().trim(Trim::MaxAge(Duration::ZERO))),
            Err(ConfigError::OutOfRange { .. })
        ));
        assert!(matches!(
            check(ok().max_in_flight_batches(0)),
            Err(ConfigError::OutOfRange { .. })
        ));
        assert!(matches!(
            check(ok().max_in_flight_bytes(0)),
            Err(ConfigError::OutOfRange { .. })
        ));
        assert!(matches!(
            check(ok().redis_response_timeout(Duration::ZERO)),
            Err(ConfigError::OutOfRange { .. })
        ));
    }

    #[test]
    fn reroute_fenced_is_on_by_default_and_off_without_the_fence() {
        let reroute = |b: ProducerBuilder| b.build().unwrap().config().reroute_fenced;
        assert!(reroute(ok()), "on by default");
        assert!(!reroute(ok().reroute_fenced(false)));
        assert!(!reroute(ok().fencing(false)), "nothing to re-route without the fence");
        assert!(reroute(ok().reroute_fenced(false).reroute_fenced(true)));
    }

    #[test]
    fn script_settings_are_checked() {
        check(ok().idempotence(true).reroute_fenced(true)).unwrap();
        assert!(matches!(
            check(ok().fencing(false).idempotence(true)),
            Err(ConfigError::ScriptRequired { setting: "idempotence" })
        ));
        assert!(matches!(
            check(ok().fencing(false).reroute_fenced(true)),
            Err(ConfigError::ScriptRequired { .. })
        ));
        check(ok().producer_id("host-1.worker_2")).unwrap();
        for bad in ["", "a{b}", "a b", &"x".repeat(65)] {
            assert!(
                matches!(check(ok().producer_id(bad)), Err(ConfigError::InvalidProducerId { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(
            check(ok().producer_idle_expiry(Duration::from_secs(30))),
            Err(ConfigError::OutOfRange {
                setting: "idle_expiry",
                ..
            })
        ));
        assert!(matches!(
            check(ok().idempotence_retries(1000)),
            Err(ConfigError::OutOfRange {
                setting: "idle_expiry",
                ..
            })
        ));
        assert!(matches!(
            check(
                ok().idempotence_retries(1001)
                    .producer_idle_expiry(Duration::from_secs(100_000))
            ),
            Err(ConfigError::OutOfRange {
                setting: "max_retries",
                ..
            })
        ));
        assert!(ok().idempotence(true).idempotence(false).config.idempotence.is_none());
        assert_eq!(
            ok().producer_id("a")
                .idempotence(true)
                .config
                .idempotence
                .unwrap()
                .producer_id
                .as_deref(),
            Some("a"),
            "idempotence(true) keeps settings given before"
        );
    }

    #[test]
    fn durability_rules_are_checked() {
        let ms = Duration::from_millis;
        check(ok().durability(Durability::replicas(1, ms(500)))).unwrap();
        check(ok().durability(Durability::Primary)).unwrap();
        check(ok().durability(Durability::replicas(2, ms(1))).fencing(false)).unwrap();
        check(ok().durability(Durability::replicas(1, ms(100))).idempotence(true)).unwrap();
        assert!(matches!(
            check(ok().durability(Durability::replicas(0, ms(500)))),
            Err(ConfigError::OutOfRange {
                setting: "durability min replicas",
                ..
            })
        ));
        for bad in [Duration::ZERO, Duration::from_micros(999), Duration::from_secs(61)] {
            assert!(
                matches!(
                    check(
                        ok().durability(Durability::replicas(1, bad))
                            .redis_response_timeout(Duration::from_secs(120))
                    ),
                    Err(ConfigError::OutOfRange {
                        setting: "durability timeout",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        // The WAIT must answer before the request's deadline (default 5 s).
        assert!(matches!(
            check(ok().durability(Durability::replicas(1, Duration::from_secs(5)))),
            Err(ConfigError::ReplicaWaitNotBelowResponseTimeout { .. })
        ));
        check(
            ok().durability(Durability::replicas(1, Duration::from_secs(5)))
                .redis_response_timeout(Duration::from_secs(6)),
        )
        .unwrap();
        assert_eq!(ok().config.durability, Durability::Primary, "the default");
    }

    #[test]
    fn build_outside_a_runtime_is_inert() {
        // No runtime here: a build that spawned a task would panic (or refuse, as it once did).
        let producer = ok().build().expect("build needs no runtime");
        assert!(producer.routing().is_none(), "nothing was fetched");
        assert_eq!(producer.stats().refreshes, 0);
    }
}

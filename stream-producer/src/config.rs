//! Producer settings: a by-value builder with typed defaults, checked once by [`ProducerConfig::validate`].

use std::time::Duration;

use protocol::names::StreamName;

use crate::error::ConfigError;
use crate::producer::Producer;

/// Approximate trimming applied by every XADD of the producer (`XADD key MAXLEN ~ n * ...` or
/// `XADD key MINID ~ id * ...`).
///
/// Trimming is *approximate* (`~`): Redis removes whole radix-tree nodes only, so a shard stream may hold
/// somewhat more than the bound, and trimming costs almost nothing. It applies per shard stream: `MaxLen(n)`
/// bounds each shard to about `n` entries, so a stream of `S` shards keeps about `S * n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Trim {
    /// Keep about this many entries per shard stream (`MAXLEN ~ n`). At least 1.
    MaxLen(u64),
    /// Drop entries older than this (`MINID ~ <now - age>`), using the producer's wall clock and Redis's
    /// time-based entry ids. Needs Redis >= 6.2. At least 1 ms.
    MaxAge(Duration),
}

/// Settings of the background batching mode ([`Producer::enqueue`]).
///
/// Records wait in a bounded queue; one task takes up to `max_batch_size` of them, waiting at most `linger` for
/// a batch to fill, groups them by shard and sends one pipeline per shard. When `max_in_flight_batches` batches
/// are being written and the queue is full, `enqueue` waits (backpressure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchingConfig {
    /// Records the queue holds before `enqueue` waits. Default 10 000.
    pub queue_capacity: usize,
    /// Largest batch. Default 512.
    pub max_batch_size: usize,
    /// Longest wait for a batch to fill once its first record arrived. Default 1 ms; zero sends whatever is
    /// queued at once.
    pub linger: Duration,
    /// Batches written concurrently. Default 8.
    pub max_in_flight_batches: usize,
}

impl Default for BatchingConfig {
    fn default() -> Self {
        BatchingConfig {
            queue_capacity: 10_000,
            max_batch_size: 512,
            linger: Duration::from_millis(1),
            max_in_flight_batches: 8,
        }
    }
}

/// The idempotent producer's settings (see [`ProducerBuilder::idempotence`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IdempotenceConfig {
    /// The producer id, part of the key of its per-shard state in Redis. Default: random per producer instance.
    /// A given id must not be used by two live producers at once; each instance also draws a random epoch, so a
    /// restarted producer with the same id starts a new sequence instead of being taken for a retry.
    pub producer_id: Option<String>,
    /// How long the producer's state for a shard (its sequence and the ids of its last call) stays in Redis after
    /// its last write to the shard (`PEXPIRE`, renewed by every write). Default 30 min; at least 1 min, and longer
    /// than the producer retries one call. A producer idle for longer simply starts a new sequence.
    pub idle_expiry: Duration,
    /// Retries of a call whose outcome is unknown (connection lost or timed out), with the same sequence numbers,
    /// before its records are reported [`Unknown`](crate::WriteState::Unknown). Default 10.
    pub max_retries: u32,
}

impl Default for IdempotenceConfig {
    fn default() -> Self {
        IdempotenceConfig {
            producer_id: None,
            idle_expiry: Duration::from_secs(30 * 60),
            max_retries: 10,
        }
    }
}

/// Longest wait between two retries of an idempotent call.
pub(crate) const IDEMPOTENT_RETRY_MAX: Duration = Duration::from_millis(500);

/// Longest producer id.
pub const MAX_PRODUCER_ID_LEN: usize = 64;

/// The settings of a [`Producer`], readable after [`build`](ProducerBuilder::build) through
/// [`Producer::config`]. `Debug` hides the coordinator token and the Redis URL's credentials.
#[derive(Clone)]
#[non_exhaustive]
pub struct ProducerConfig {
    /// The stream records are published to.
    pub stream: StreamName,
    /// Coordinator base URLs (`http://host:port`), tried in order on connection errors and
    /// `503 COORDINATOR_TERMINATING`.
    pub coordinator_urls: Vec<String>,
    /// Bearer token for the coordinator, if it requires one.
    pub coordinator_token: Option<String>,
    /// Deadline of one routing request to one coordinator URL. Default 2 s. Keep it well below the routing lease:
    /// a publish that must refresh first waits up to this long.
    pub coordinator_timeout: Duration,
    /// Redis URL (`redis://host:port/db`).
    pub redis_url: String,
    /// Redis connections used for publishing. Each is a multiplexed connection that pipelines every concurrent
    /// request; shard `s` always uses connection `s % connections`, which keeps each shard's records in order.
    /// Default 2.
    pub connections: usize,
    /// Deadline for opening one Redis connection. Default 2 s.
    pub redis_connect_timeout: Duration,
    /// Deadline for Redis's answer to one pipeline; past it the outcome is [`Unknown`](crate::WriteState::Unknown).
    /// Default 5 s.
    pub redis_response_timeout: Duration,
    /// Approximate trimming of every shard stream, if any. Default none.
    pub trim: Option<Trim>,
    /// Background batching settings.
    pub batching: BatchingConfig,
    /// First wait after a failed routing refresh; doubles per failure up to `refresh_retry_max`. Default 50 ms.
    pub refresh_retry_min: Duration,
    /// Longest wait between failed routing refreshes. Default 1 s.
    pub refresh_retry_max: Duration,
    /// Whether every publish goes through the fenced publish script (one `EVALSHA` per shard batch that checks the
    /// producer's routing version against the shard's fence and writes the whole batch or nothing). Default on;
    /// off sends plain pipelined `XADD`s, which a reshard cannot fence.
    pub fencing: bool,
    /// Whether records refused by a fence are re-routed with the refreshed routing and sent again by the producer
    /// itself (see [`ProducerBuilder::reroute_fenced`]). Default off.
    pub reroute_fenced: bool,
    /// The idempotent producer, when on. Default off.
    pub idempotence: Option<IdempotenceConfig>,
}

impl std::fmt::Debug for ProducerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerConfig")
            .field("stream", &self.stream)
            .field("coordinator_urls", &self.coordinator_urls)
            .field("coordinator_token", &self.coordinator_token.as_ref().map(|_| "***"))
            .field("coordinator_timeout", &self.coordinator_timeout)
            .field("redis_url", &protocol::redact::redact_url(&self.redis_url))
            .field("connections", &self.connections)
            .field("redis_connect_timeout", &self.redis_connect_timeout)
            .field("redis_response_timeout", &self.redis_response_timeout)
            .field("trim", &self.trim)
            .field("batching", &self.batching)
            .field("refresh_retry_min", &self.refresh_retry_min)
            .field("refresh_retry_max", &self.refresh_retry_max)
            .field("fencing", &self.fencing)
            .field("reroute_fenced", &self.reroute_fenced)
            .field("idempotence", &self.idempotence)
            .finish()
    }
}

impl ProducerConfig {
    fn new(stream: StreamName) -> Self {
        ProducerConfig {
            stream,
            coordinator_urls: Vec::new(),
            coordinator_token: None,
            coordinator_timeout: Duration::from_secs(2),
            redis_url: String::new(),
            connections: 2,
            redis_connect_timeout: Duration::from_secs(2),
            redis_response_timeout: Duration::from_secs(5),
            trim: None,
            batching: BatchingConfig::default(),
            refresh_retry_min: Duration::from_millis(50),
            refresh_retry_max: Duration::from_secs(1),
            fencing: true,
            reroute_fenced: false,
            idempotence: None,
        }
    }

    /// Checks every rule, including the cross-field ones.
    ///
    /// # Errors
    /// The first broken rule, as a [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        // The coordinator client checks the URL list (non-empty, http(s)://).
        client_core::CoordClient::new(
            self.coordinator_urls.clone(),
            self.coordinator_timeout,
            self.coordinator_token.clone(),
        )
        .map_err(ConfigError::Coordinator)?;
        if self.redis_url.is_empty() {
            return Err(ConfigError::MissingRedis);
        }
        redis::Client::open(self.redis_url.as_str()).map_err(ConfigError::Redis)?;
        range("connections", "between 1 and 64", self.connections, |n| {
            (1..=64).contains(&n)
        })?;
        range_duration("coordinator_timeout", self.coordinator_timeout)?;
        range_duration("redis_connect_timeout", self.redis_connect_timeout)?;
        range_duration("redis_response_timeout", self.redis_response_timeout)?;
        range_duration("refresh_retry_min", self.refresh_retry_min)?;
        if self.refresh_retry_min > self.refresh_retry_max {
            return Err(ConfigError::RetryBackoffInverted {
                min: self.refresh_retry_min,
                max: self.refresh_retry_max,
            });
        }
        match self.trim {
            Some(Trim::MaxLen(0)) => {
                return Err(ConfigError::OutOfRange {
                    name: "trim MaxLen",
                    rule: "at least 1",
                    value: "0".into(),
                })
            }
            Some(Trim::MaxAge(age)) if age < Duration::from_millis(1) => {
                return Err(ConfigError::OutOfRange {
                    name: "trim MaxAge",
                    rule: "at least 1 ms",
                    value: format!("{age:?}"),
                })
            }
            _ => {}
        }
        let b = &self.batching;
        range("queue_capacity", "at least 1", b.queue_capacity, |n| n >= 1)?;
        range("max_batch_size", "at least 1", b.max_batch_size, |n| n >= 1)?;
        range("max_in_flight_batches", "at least 1", b.max_in_flight_batches, |n| {
            n >= 1
        })?;
        if b.linger > Duration::from_secs(10) {
            return Err(ConfigError::OutOfRange {
                name: "linger",
                rule: "at most 10 s",
                value: format!("{:?}", b.linger),
            });
        }
        if b.queue_capacity < b.max_batch_size {
            return Err(ConfigError::QueueSmallerThanBatch {
                queue_capacity: b.queue_capacity,
                max_batch_size: b.max_batch_size,
            });
        }
        self.validate_script_settings()
    }

    fn validate_script_settings(&self) -> Result<(), ConfigError> {
        if !self.fencing {
            if self.reroute_fenced {
                return Err(ConfigError::ScriptRequired {
                    setting: "reroute_fenced",
                });
            }
            if self.idempotence.is_some() {
                return Err(ConfigError::ScriptRequired { setting: "idempotence" });
            }
        }
        let Some(idem) = &self.idempotence else {
            return Ok(());
        };
        if let Some(id) = &idem.producer_id {
            check_producer_id(id)?;
        }
        // The state must outlive every retry of a call, or a late retry would be taken for a new call.
        let one_call = self.redis_response_timeout + IDEMPOTENT_RETRY_MAX;
        let retrying = one_call.saturating_mul(idem.max_retries.saturating_add(1));
        if idem.idle_expiry < Duration::from_secs(60) || idem.idle_expiry <= retrying {
            return Err(ConfigError::OutOfRange {
                name: "idle_expiry",
                rule: "at least 1 min and longer than (max_retries + 1) x (redis_response_timeout + 500 ms)",
                value: format!("{:?}", idem.idle_expiry),
            });
        }
        if idem.max_retries > 1000 {
            return Err(ConfigError::OutOfRange {
                name: "max_retries",
                rule: "at most 1000",
                value: idem.max_retries.to_string(),
            });
        }
        Ok(())
    }
}

/// A producer id is part of a Redis key: 1 to [`MAX_PRODUCER_ID_LEN`] ASCII letters, digits, `.`, `_` or `-`.
fn check_producer_id(id: &str) -> Result<(), ConfigError> {
    let rule = if id.is_empty() || id.len() > MAX_PRODUCER_ID_LEN {
        Some("1 to 64 characters")
    } else if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        Some("only ASCII letters, digits, '.', '_' and '-'")
    } else {
        None
    };
    match rule {
        Some(rule) => Err(ConfigError::InvalidProducerId {
            id: id.chars().take(80).collect(),
            rule,
        }),
        None => Ok(()),
    }
}

fn range(name: &'static str, rule: &'static str, value: usize, ok: impl Fn(usize) -> bool) -> Result<(), ConfigError> {
    if ok(value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            name,
            rule,
            value: value.to_string(),
        })
    }
}

fn range_duration(name: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        Err(ConfigError::OutOfRange {
            name,
            rule: "positive",
            value: format!("{value:?}"),
        })
    } else {
        Ok(())
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

    /// Deadline of one routing request to one coordinator URL (default 2 s).
    pub fn coordinator_timeout(mut self, timeout: Duration) -> Self {
        self.config.coordinator_timeout = timeout;
        self
    }

    /// The Redis URL shard streams live in.
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.config.redis_url = url.into();
        self
    }

    /// Number of publishing connections (default 2).
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

    /// Batches written concurrently by the batching mode (default 8).
    pub fn max_in_flight_batches(mut self, n: usize) -> Self {
        self.config.batching.max_in_flight_batches = n;
        self
    }

    /// Backoff between failed routing refreshes: first `min`, doubling up to `max` (default 50 ms to 1 s).
    pub fn refresh_retry(mut self, min: Duration, max: Duration) -> Self {
        self.config.refresh_retry_min = min;
        self.config.refresh_retry_max = max;
        self
    }

    /// Whether every publish goes through the fenced publish script (default on). Off: plain pipelined `XADD`s, as
    /// before the fence existed; a producer that missed a reshard then keeps writing keys to shards they left.
    pub fn fencing(mut self, on: bool) -> Self {
        self.config.fencing = on;
        self
    }

    /// Re-route and retry records refused by a shard fence (default off: they fail with
    /// [`PublishError::Fenced`](crate::PublishError::Fenced), not written, and the producer refreshes its routing
    /// at once).
    ///
    /// On: the producer refreshes its routing, chooses the refused records' shards again and sends them again
    /// (up to 3 times) before the publish call returns. Records of one key from one producer stay in order iff no
    /// later record of that key is handed to the producer while an earlier one's call has not returned: sequential
    /// `send`s, all of them in one `send_batch`, or the batching mode with `max_in_flight_batches(1)`. With several
    /// calls in flight, a later call that routes with the new routing can be written before an earlier refused call
    /// is sent again.
    pub fn reroute_fenced(mut self, on: bool) -> Self {
        self.config.reroute_fenced = on;
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

    /// Where the highest routing version ever observed is kept (key: the stream name). Default: the process-wide
    /// memory ([`MemoryVersionStore::process`](client_core::MemoryVersionStore::process)), shared by every
    /// producer and consumer of the process, so a producer recreated in the same process still reports what an
    /// earlier one saw; a [`FileVersionStore`](client_core::FileVersionStore) lets a restarted process still
    /// report a rolled-back routing.
    pub fn version_store(mut self, store: impl client_core::VersionStore) -> Self {
        self.version_store = Some(client_core::SharedVersionStore::new(store));
        self
    }

    /// Checks the settings and starts the producer's background tasks (routing refresher, batcher). Does no
    /// I/O itself: the first routing is fetched in the background, and the first publish (or
    /// [`Producer::ready`]) waits for it.
    ///
    /// # Errors
    /// [`ConfigError`] naming the broken rule; [`ConfigError::NoRuntime`] outside a tokio runtime.
    pub fn build(mut self) -> Result<Producer, ConfigError> {
        self.config.stream = StreamName::new(self.stream)?;
        self.config.validate()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConfigError::NoRuntime);
        }
        let store = self
            .version_store
            .unwrap_or_else(client_core::SharedVersionStore::process_default);
        Producer::start(self.config, store)
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

    fn check(b: ProducerBuilder) -> Result<(), ConfigError> {
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
    fn rules_are_checked() {
        assert!(matches!(
            check(ok().connections(0)),
            Err(ConfigError::OutOfRange {
                name: "connections",
                ..
            })
        ));
        assert!(matches!(
            check(Producer::builder("orders").redis("redis://x")),
            Err(ConfigError::Coordinator(_))
        ));
        assert!(matches!(
            check(ok().coordinator("ftp://nope")),
            Err(ConfigError::Coordinator(_))
        ));
        assert!(matches!(
            check(Producer::builder("orders").coordinator("http://c")),
            Err(ConfigError::MissingRedis)
        ));
        assert!(matches!(check(ok().redis("nope://x")), Err(ConfigError::Redis(_))));
        assert!(matches!(
            check(Producer::builder("bad name{").coordinator("http://c")),
            Err(ConfigError::Stream(_))
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
            check(ok().redis_response_timeout(Duration::ZERO)),
            Err(ConfigError::OutOfRange { .. })
        ));
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
                name: "idle_expiry",
                ..
            })
        ));
        assert!(matches!(
            check(ok().idempotence_retries(1000)),
            Err(ConfigError::OutOfRange {
                name: "idle_expiry",
                ..
            })
        ));
        assert!(matches!(
            check(
                ok().idempotence_retries(1001)
                    .producer_idle_expiry(Duration::from_secs(100_000))
            ),
            Err(ConfigError::OutOfRange {
                name: "max_retries",
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
    fn build_outside_a_runtime_is_refused() {
        assert!(matches!(ok().build(), Err(ConfigError::NoRuntime)));
    }
}

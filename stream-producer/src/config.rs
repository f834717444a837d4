//! The producer's settings: [`ProducerConfig`], [`BatchingConfig`] and [`Trim`], typed defaults, and the rules
//! checked once by [`ProducerConfig::validate`]. The builder that fills them is in `builder`.

use std::time::Duration;

use protocol::names::StreamName;

use crate::error::ConfigError;

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

/// Settings of the background batching mode ([`Producer::enqueue`](crate::Producer::enqueue)).
///
/// Callers append records to an open batch of up to `max_batch_size` records, which goes when it is full or
/// `linger` after its first record; one task sends the batches, one pipeline per shard each. When
/// `max_in_flight_batches` batches, or `max_in_flight_bytes` of records, are being written, batches wait, and once
/// `queue_capacity` records are accepted and not sent, `enqueue` waits (backpressure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchingConfig {
    /// Records accepted and not sent yet (the open batch and the batches waiting for the in-flight budget)
    /// before `enqueue` waits. Default 10 000.
    pub queue_capacity: usize,
    /// Largest batch. Default 512.
    pub max_batch_size: usize,
    /// Longest wait for a batch to fill once its first record arrived. Default 1 ms; zero sends whatever is
    /// queued at once.
    pub linger: Duration,
    /// Batches written concurrently. Default 32: the fenced producer (the default) holds a batch for two round
    /// trips, the fence check and then the writes, and measured 4 % faster with 32 than with 8, the plain
    /// producer 1.6 % slower (`docs/producer.md`, "Batches in flight").
    pub max_in_flight_batches: usize,
    /// Bytes of records (keys, field names and values) written concurrently: a batch waits while this many are
    /// in flight (one batch may always go, whatever its size). Bounds what the batches in flight hold when
    /// records are large. Default 64 MiB.
    pub max_in_flight_bytes: usize,
}

impl Default for BatchingConfig {
    fn default() -> Self {
        BatchingConfig {
            queue_capacity: 10_000,
            max_batch_size: 512,
            linger: Duration::from_millis(1),
            max_in_flight_batches: 32,
            max_in_flight_bytes: 64 << 20,
        }
    }
}

/// The idempotent producer's settings (see [`ProducerBuilder::idempotence`](crate::ProducerBuilder::idempotence)).
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

/// What [`Written`](crate::WriteState::Written) means: acknowledged by the Redis master (primary) alone, or also by
/// replicas (Kafka's `acks=1` against `acks=all` with `min.insync.replicas`). See
/// [`ProducerBuilder::durability`](crate::ProducerBuilder::durability).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// Written means the master that holds the shard's stream executed the write (the default). Redis replicates
    /// asynchronously: a failover to a replica that had not received the write yet loses it, and the producer
    /// cannot tell.
    #[default]
    Primary,
    /// Written means the master executed the write *and* at least `min` of its replicas confirmed it within
    /// `timeout`: every write is followed, on the same connection and in the same request, by
    /// `WAIT <min> <timeout ms>`. When fewer confirm in time the records get
    /// [`PublishError::NotReplicated`](crate::PublishError::NotReplicated) ([`Unknown`](crate::WriteState::Unknown):
    /// written on the master, may or may not survive a failover), never Written.
    Replicas {
        /// Replicas that must confirm a write. At least 1.
        min: u32,
        /// How long the master waits for them (whole milliseconds, rounded up). At least 1 ms, at most
        /// [`MAX_REPLICA_WAIT`], and below [`ProducerConfig::redis_response_timeout`] (the `WAIT`'s answer must
        /// arrive before the request's deadline).
        timeout: Duration,
    },
}

impl Durability {
    /// [`Durability::Replicas`]: Written after `min` replicas confirmed within `timeout`.
    pub fn replicas(min: u32, timeout: Duration) -> Self {
        Durability::Replicas { min, timeout }
    }
}

/// Longest [`Durability::Replicas`] timeout.
pub const MAX_REPLICA_WAIT: Duration = Duration::from_secs(60);

/// Longest wait between two retries of an idempotent call.
pub(crate) const IDEMPOTENT_RETRY_MAX: Duration = Duration::from_millis(500);

/// How [`ProducerConfig::redis_url`] names a Redis Cluster.
const CLUSTER_PREFIX: &str = "cluster:";

/// Longest producer id.
pub const MAX_PRODUCER_ID_LEN: usize = 64;

/// The settings of a [`Producer`](crate::Producer), readable after [`build`](crate::ProducerBuilder::build)
/// through [`Producer::config`](crate::Producer::config). `Debug` hides the coordinator token and the Redis URL's credentials.
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
    /// TLS settings of `https://` coordinator URLs (see
    /// [`ProducerBuilder::coordinator_tls`](crate::ProducerBuilder::coordinator_tls)).
    pub coordinator_tls: redis_link::TlsOptions,
    /// Deadline of one routing request to one coordinator URL. Default 2 s. Keep it well below the routing lease:
    /// a publish that must refresh first waits up to this long. It also bounds how long
    /// [`Producer::ready`](crate::Producer::ready) and the first publish retry retryable refresh failures.
    pub coordinator_timeout: Duration,
    /// Where the shard streams live: one Redis URL (`redis://host:port/db`), or a Redis Cluster as `cluster:`
    /// followed by the comma-separated URLs of some of its nodes (`cluster:redis://a:6379,redis://b:6379`; the
    /// other nodes are discovered, every node connection uses the first URL's credentials and TLS settings). See
    /// [`redis_link::RedisTarget`].
    pub redis_url: String,
    /// Redis connections used for publishing (per master on a Redis Cluster). Each is a pipelining connection
    /// ([`redis_link::PipelinedConnection`]) shared by every concurrent request; shard `s` always uses connection `s % connections`, which keeps
    /// each shard's records in order. The fenced producer on one server checks one transaction at a time per
    /// connection (each carrying every batch queued on it; the next one's check follows the previous `EXEC`). Default 8
    /// (2 until issue 17: 8 lets the checked transactions keep Redis busy, `producer_bench`).
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
    /// Whether every publish is fenced: each shard batch is checked against the shard's fence atomically with its
    /// writes and written whole or not at all (a `WATCH`ed transaction on one server, the publish script for the
    /// idempotent producer and on a Redis Cluster). Default on; off sends plain pipelined `XADD`s, which a reshard
    /// cannot fence.
    pub fencing: bool,
    /// Whether records refused by a fence are re-routed with the refreshed routing and sent again by the producer
    /// itself (see [`ProducerBuilder::reroute_fenced`](crate::ProducerBuilder::reroute_fenced)). Default on (off
    /// until issue 42: a refused record was never written, so sending it again cannot duplicate it); off when
    /// `fencing` is off and this was not set, since nothing can then be refused.
    pub reroute_fenced: bool,
    /// The idempotent producer, when on. Default off.
    pub idempotence: Option<IdempotenceConfig>,
    /// What Written means: the master's acknowledgement (default), or also `min` replicas' (`WAIT`).
    pub durability: Durability,
}

impl std::fmt::Debug for ProducerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerConfig")
            .field("stream", &self.stream)
            .field("coordinator_urls", &self.coordinator_urls)
            .field("coordinator_token", &self.coordinator_token.as_ref().map(|_| "***"))
            .field("coordinator_tls", &self.coordinator_tls)
            .field("coordinator_timeout", &self.coordinator_timeout)
            .field("redis_url", &self.redacted_redis_url())
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
            .field("durability", &self.durability)
            .finish()
    }
}

impl ProducerConfig {
    pub(crate) fn new(stream: StreamName) -> Self {
        ProducerConfig {
            stream,
            coordinator_urls: Vec::new(),
            coordinator_token: None,
            coordinator_tls: redis_link::TlsOptions::default(),
            coordinator_timeout: Duration::from_secs(2),
            redis_url: String::new(),
            connections: 8,
            redis_connect_timeout: Duration::from_secs(2),
            redis_response_timeout: Duration::from_secs(5),
            trim: None,
            batching: BatchingConfig::default(),
            refresh_retry_min: Duration::from_millis(50),
            refresh_retry_max: Duration::from_secs(1),
            fencing: true,
            reroute_fenced: true,
            idempotence: None,
            durability: Durability::Primary,
        }
    }

    /// Checks every rule, including the cross-field ones.
    ///
    /// # Errors
    /// The first broken rule, as a [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.coordinator_urls.is_empty() {
            return Err(ConfigError::MissingCoordinator);
        }
        if let Some(bad) = client_core::coord_client::first_invalid_url(&self.coordinator_urls) {
            return Err(ConfigError::InvalidCoordinatorUrl(bad.to_owned()));
        }
        client_core::coord_tls::client_config(&self.coordinator_tls).map_err(ConfigError::CoordinatorTls)?;
        if self.redis_url.is_empty() {
            return Err(ConfigError::MissingRedisUrl);
        }
        if self.is_cluster() {
            redis_link::RedisTarget::parse(&self.redis_url)?;
        } else {
            redis::Client::open(self.redis_url.as_str()).map_err(|source| ConfigError::InvalidRedisUrl {
                url: protocol::redact::redact_url(&self.redis_url),
                source,
            })?;
        }
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
                    setting: "trim MaxLen",
                    rule: "at least 1",
                    value: "0".into(),
                })
            }
            Some(Trim::MaxAge(age)) if age < Duration::from_millis(1) => {
                return Err(ConfigError::OutOfRange {
                    setting: "trim MaxAge",
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
        range("max_in_flight_bytes", "at least 1", b.max_in_flight_bytes, |n| n >= 1)?;
        if b.linger > Duration::from_secs(10) {
            return Err(ConfigError::OutOfRange {
                setting: "linger",
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
        self.validate_durability()?;
        self.validate_script_settings()
    }

    fn validate_durability(&self) -> Result<(), ConfigError> {
        let Durability::Replicas { min, timeout } = self.durability else {
            return Ok(());
        };
        if min == 0 {
            return Err(ConfigError::OutOfRange {
                setting: "durability min replicas",
                rule: "at least 1",
                value: "0".into(),
            });
        }
        // WAIT's timeout is in milliseconds, and 0 means "block forever".
        if timeout < Duration::from_millis(1) || timeout > MAX_REPLICA_WAIT {
            return Err(ConfigError::OutOfRange {
                setting: "durability timeout",
                rule: "between 1 ms and 60 s",
                value: format!("{timeout:?}"),
            });
        }
        if timeout >= self.redis_response_timeout {
            return Err(ConfigError::ReplicaWaitNotBelowResponseTimeout {
                wait: timeout,
                response: self.redis_response_timeout,
            });
        }
        Ok(())
    }

    /// [`redis_url`](Self::redis_url) with every password redacted.
    fn redacted_redis_url(&self) -> String {
        if self.is_cluster() {
            redis_link::RedisTarget::parse(&self.redis_url).map_or_else(|_| "cluster:***".to_owned(), |t| t.redacted())
        } else {
            protocol::redact::redact_url(&self.redis_url)
        }
    }

    /// Whether [`redis_url`](Self::redis_url) names a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.redis_url.trim_start().starts_with(CLUSTER_PREFIX)
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
        // The state must outlive every retry of a call, or a late retry would be taken for a new call. On a
        // cluster one attempt may also follow redirects and retry `TRYAGAIN` for up to one response timeout.
        let attempt = if self.is_cluster() {
            self.redis_response_timeout.saturating_mul(2)
        } else {
            self.redis_response_timeout
        };
        let one_call = attempt + IDEMPOTENT_RETRY_MAX;
        let retrying = one_call.saturating_mul(idem.max_retries.saturating_add(1));
        if idem.idle_expiry < Duration::from_secs(60) || idem.idle_expiry <= retrying {
            return Err(ConfigError::OutOfRange {
                setting: "idle_expiry",
                rule: if self.is_cluster() {
                    "at least 1 min and longer than (max_retries + 1) x (2 x redis_response_timeout + 500 ms) on a cluster"
                } else {
                    "at least 1 min and longer than (max_retries + 1) x (redis_response_timeout + 500 ms)"
                },
                value: format!("{:?}", idem.idle_expiry),
            });
        }
        if idem.max_retries > 1000 {
            return Err(ConfigError::OutOfRange {
                setting: "max_retries",
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

fn range(
    setting: &'static str,
    rule: &'static str,
    value: usize,
    ok: impl Fn(usize) -> bool,
) -> Result<(), ConfigError> {
    if ok(value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            setting,
            rule,
            value: value.to_string(),
        })
    }
}

fn range_duration(setting: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        Err(ConfigError::OutOfRange {
            setting,
            rule: "positive",
            value: format!("{value:?}"),
        })
    } else {
        Ok(())
    }
}

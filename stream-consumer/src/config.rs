//! Configuration: a by-value builder with typed defaults, checked once by [`ConsumerConfig::validate`].

use protocol::names::{GroupName, MemberId, StreamName};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::consumer::Consumer;
use crate::error::ConfigError;
use crate::handler::{DynHandler, DynListener, Handler, RebalanceListener};
use crate::version_store::{SharedVersionStore, VersionStore};

/// Where a consumer group starts on a shard stream that has no such group yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StartPosition {
    /// From the first entry (`XGROUP CREATE ... 0`): nothing published before the first consumer ran is lost.
    /// The default.
    #[default]
    Beginning,
    /// From new entries only (`XGROUP CREATE ... $`).
    End,
}

impl StartPosition {
    /// The id given to `XGROUP CREATE`.
    pub(crate) fn group_create_id(self) -> &'static str {
        match self {
            StartPosition::Beginning => "0",
            StartPosition::End => "$",
        }
    }
}

/// Timings of a consumer. Defaults match the coordinator's default group timings.
///
/// The coordinator's answers carry the group's heartbeat interval and assignment lease; the consumer follows
/// them, but never uses a lease longer than [`assignment_lease`](Timings::assignment_lease). The rules checked by
/// [`ConsumerConfig::validate`]: `heartbeat_interval < assignment_lease <= member_ttl`, `request_timeout <
/// assignment_lease`, `2 * lease_safety_margin < assignment_lease`, and every duration positive and at most one
/// day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timings {
    /// Heartbeat interval used until the coordinator's first answer (then the coordinator's).
    pub heartbeat_interval: Duration,
    /// The group's member TTL: how long the coordinator keeps a silent member. Only used to check the lease.
    pub member_ttl: Duration,
    /// Longest assignment lease the consumer accepts (the coordinator's, if shorter, wins).
    pub assignment_lease: Duration,
    /// Taken off every lease: covers clock-rate differences and the time a reader needs to notice.
    pub lease_safety_margin: Duration,
    /// Deadline of one coordinator request (per URL tried).
    pub request_timeout: Duration,
    /// `BLOCK` of a shard reader's `XREADGROUP`. The reader's dedicated connection waits longer than this for the
    /// answer (redis-rs's default response timeout of 500 ms would cut blocking reads short).
    pub read_block: Duration,
    /// Response timeout of the shared connection (acks, claims, group creation).
    pub redis_response_timeout: Duration,
    /// How long a graceful close waits for in-flight handlers before dropping them.
    pub drain_timeout: Duration,
    /// First pause before a failed handler is retried (doubles, with jitter).
    pub retry_backoff_min: Duration,
    /// Longest pause between two retries of a failed handler.
    pub retry_backoff_max: Duration,
    /// How long a shard's reader may fail to reach Redis (every command failing) before the member gives its
    /// shards back: it stops every reader, leaves the group so the coordinator moves the shards to members that
    /// can read them, and joins again once Redis answers the start-up check. Default 30 s: longer than a Redis
    /// restart, so a short outage (which every member sees alike) moves nothing.
    pub read_failure_timeout: Duration,
    /// Longest run of a [`RebalanceListener`](crate::RebalanceListener) callback; a callback still running then
    /// is dropped. `on_assigned` and `on_revoked` are also dropped at the end of the assignment lease.
    pub listener_timeout: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            heartbeat_interval: Duration::from_secs(2),
            member_ttl: Duration::from_secs(10),
            assignment_lease: Duration::from_secs(8),
            lease_safety_margin: Duration::from_millis(500),
            request_timeout: Duration::from_secs(3),
            read_block: Duration::from_secs(2),
            redis_response_timeout: Duration::from_secs(2),
            drain_timeout: Duration::from_secs(30),
            retry_backoff_min: Duration::from_millis(100),
            retry_backoff_max: Duration::from_secs(10),
            read_failure_timeout: Duration::from_secs(30),
            listener_timeout: Duration::from_secs(5),
        }
    }
}

/// Longest accepted duration setting.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// A validated consumer configuration (readable through [`Consumer::config`]). `Debug` hides the coordinator
/// token and the Redis URL's credentials.
#[derive(Clone)]
#[non_exhaustive]
pub struct ConsumerConfig {
    /// The logical stream (prefix of the shard keys).
    pub stream: StreamName,
    /// The consumer group: the coordinator group and the Redis consumer group on every shard stream.
    pub group: GroupName,
    /// The member id: the Redis consumer name on every shard stream.
    pub member_id: MemberId,
    /// Whether `member_id` was generated (no id was configured).
    pub member_id_generated: bool,
    /// Coordinator base URLs, tried in turn.
    pub coordinator_urls: Vec<String>,
    /// Bearer token for the coordinator, if it requires one.
    pub coordinator_token: Option<String>,
    /// Redis URL of the shard streams.
    pub redis_url: String,
    /// Where a new Redis consumer group starts.
    pub start_from: StartPosition,
    /// Timings.
    pub timings: Timings,
    /// Deliveries after which an entry is dead-lettered instead of handled again.
    pub max_deliveries: u32,
    /// Entries fetched per read (`COUNT`).
    pub batch_size: usize,
}

impl fmt::Debug for ConsumerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsumerConfig")
            .field("stream", &self.stream)
            .field("group", &self.group)
            .field("member_id", &self.member_id)
            .field("member_id_generated", &self.member_id_generated)
            .field("coordinator_urls", &self.coordinator_urls)
            .field("coordinator_token", &self.coordinator_token.as_ref().map(|_| "***"))
            .field("redis_url", &protocol::redact::redact_url(&self.redis_url))
            .field("start_from", &self.start_from)
            .field("timings", &self.timings)
            .field("max_deliveries", &self.max_deliveries)
            .field("batch_size", &self.batch_size)
            .finish()
    }
}

impl ConsumerConfig {
    /// Checks the cross-field rules.
    ///
    /// # Errors
    /// The first [`ConfigError`] found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.coordinator_urls.is_empty() {
            return Err(ConfigError::MissingCoordinator);
        }
        if let Some(bad) = self
            .coordinator_urls
            .iter()
            .find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
        {
            return Err(ConfigError::InvalidCoordinatorUrl(bad.clone()));
        }
        redis::Client::open(self.redis_url.as_str()).map_err(|source| ConfigError::InvalidRedisUrl {
            url: protocol::redact::redact_url(&self.redis_url),
            source,
        })?;
        let t = &self.timings;
        let positive = [
            ("heartbeat_interval", t.heartbeat_interval),
            ("member_ttl", t.member_ttl),
            ("assignment_lease", t.assignment_lease),
            ("request_timeout", t.request_timeout),
            ("read_block", t.read_block),
            ("redis_response_timeout", t.redis_response_timeout),
            ("drain_timeout", t.drain_timeout),
            ("retry_backoff_min", t.retry_backoff_min),
            ("read_failure_timeout", t.read_failure_timeout),
            ("listener_timeout", t.listener_timeout),
        ];
        if let Some((setting, _)) = positive.iter().find(|(_, d)| d.is_zero()) {
            return Err(ConfigError::Invalid {
                setting,
                reason: "must be positive",
            });
        }
        let all = positive.into_iter().chain([
            ("lease_safety_margin", t.lease_safety_margin),
            ("retry_backoff_max", t.retry_backoff_max),
        ]);
        if let Some((setting, _)) = all.into_iter().find(|(_, d)| *d > MAX_DURATION) {
            return Err(ConfigError::Invalid {
                setting,
                reason: "must be at most one day",
            });
        }
        if t.read_block < Duration::from_millis(1) {
            return Err(ConfigError::Invalid {
                setting: "read_block",
                reason: "must be at least 1 ms (BLOCK 0 would block forever)",
            });
        }
        if t.assignment_lease > t.member_ttl {
            return Err(ConfigError::LeaseAboveTtl {
                lease: t.assignment_lease,
                ttl: t.member_ttl,
            });
        }
        if t.heartbeat_interval >= t.assignment_lease {
            return Err(ConfigError::HeartbeatNotBelowLease {
                heartbeat: t.heartbeat_interval,
                lease: t.assignment_lease,
            });
        }
        if t.request_timeout >= t.assignment_lease {
            return Err(ConfigError::RequestTimeoutNotBelowLease {
                timeout: t.request_timeout,
                lease: t.assignment_lease,
            });
        }
        if t.lease_safety_margin * 2 >= t.assignment_lease {
            return Err(ConfigError::MarginTooLarge {
                margin: t.lease_safety_margin,
                lease: t.assignment_lease,
            });
        }
        if t.retry_backoff_min > t.retry_backoff_max {
            return Err(ConfigError::Invalid {
                setting: "retry_backoff_max",
                reason: "must not be below retry_backoff_min",
            });
        }
        if self.max_deliveries == 0 {
            return Err(ConfigError::Invalid {
                setting: "max_deliveries",
                reason: "must be at least 1",
            });
        }
        if self.batch_size == 0 {
            return Err(ConfigError::Invalid {
                setting: "batch_size",
                reason: "must be at least 1",
            });
        }
        Ok(())
    }
}

/// Builds a [`Consumer`]; created by [`Consumer::builder`].
///
/// Required: at least one [`coordinator`](Self::coordinator), a [`redis`](Self::redis) URL and a
/// [`handler`](Self::handler). Everything else has a default.
///
/// # Example
/// A worker as deployed: two coordinators, a stable member id, new groups starting at new entries, a file
/// version store that survives restarts.
/// ```no_run
/// use std::time::Duration;
/// use stream_consumer::{Consumer, FileVersionStore, Message, StartPosition};
///
/// # fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let pod = std::env::var("HOSTNAME")?;
/// let consumer = Consumer::builder("orders", "billing")
///     .coordinators(["http://coordinator-0:7400", "http://coordinator-1:7400"])
///     .coordinator_token(std::env::var("COORD_TOKEN")?)
///     .redis("redis://redis:6379/0")
///     // Stable across restarts: the new process takes the old one's shards once its lease ended.
///     .member_id(pod)
///     .start_from(StartPosition::End)
///     .max_deliveries(5)
///     .batch_size(128)
///     .drain_timeout(Duration::from_secs(10))
///     .version_store(FileVersionStore::new("state/versions")?)
///     .handler(|_msg: Message| async { Ok::<_, std::io::Error>(()) })
///     // Checks every setting and the timing rules; connects to nothing.
///     .build()?;
/// # let _ = consumer;
/// # Ok(())
/// # }
/// ```
pub struct ConsumerBuilder {
    stream: String,
    group: String,
    member_id: Option<String>,
    coordinator_urls: Vec<String>,
    coordinator_token: Option<String>,
    redis_url: Option<String>,
    start_from: StartPosition,
    timings: Timings,
    max_deliveries: u32,
    batch_size: usize,
    handler: Option<Arc<dyn DynHandler>>,
    listener: Option<Arc<dyn DynListener>>,
    version_store: Option<SharedVersionStore>,
}

impl fmt::Debug for ConsumerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsumerBuilder")
            .field("stream", &self.stream)
            .field("group", &self.group)
            .field("member_id", &self.member_id)
            .field("coordinator_urls", &self.coordinator_urls)
            .field(
                "redis_url",
                &self.redis_url.as_deref().map(protocol::redact::redact_url),
            )
            .field("start_from", &self.start_from)
            .field("timings", &self.timings)
            .field("max_deliveries", &self.max_deliveries)
            .field("batch_size", &self.batch_size)
            .field("handler", &self.handler.is_some())
            .field("listener", &self.listener.is_some())
            .field("version_store", &self.version_store.is_some())
            .finish_non_exhaustive()
    }
}

/// Default of [`ConsumerBuilder::max_deliveries`].
pub const DEFAULT_MAX_DELIVERIES: u32 = 10;
/// Default of [`ConsumerBuilder::batch_size`].
pub const DEFAULT_BATCH_SIZE: usize = 64;

impl ConsumerBuilder {
    pub(crate) fn new(stream: impl Into<String>, group: impl Into<String>) -> Self {
        ConsumerBuilder {
            stream: stream.into(),
            group: group.into(),
            member_id: None,
            coordinator_urls: Vec::new(),
            coordinator_token: None,
            redis_url: None,
            start_from: StartPosition::default(),
            timings: Timings::default(),
            max_deliveries: DEFAULT_MAX_DELIVERIES,
            batch_size: DEFAULT_BATCH_SIZE,
            handler: None,
            listener: None,
            version_store: None,
        }
    }

    /// Adds a coordinator base URL (`http://host:port`). Give several for rolling updates: a terminating or
    /// unreachable coordinator is skipped within the same heartbeat.
    pub fn coordinator(mut self, url: impl Into<String>) -> Self {
        self.coordinator_urls.push(url.into());
        self
    }

    /// Adds several coordinator base URLs.
    pub fn coordinators<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.coordinator_urls.extend(urls.into_iter().map(Into::into));
        self
    }

    /// Bearer token the coordinator requires from clients, if any.
    pub fn coordinator_token(mut self, token: impl Into<String>) -> Self {
        self.coordinator_token = Some(token.into());
        self
    }

    /// Redis URL of the shard streams (`redis://host:port/db`).
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.redis_url = Some(url.into());
        self
    }

    /// A stable member id (for example the pod name). Without one a random id is generated; a stable id lets a
    /// restarted process take its place in the group (the coordinator hands it the old incarnation's shards once
    /// that incarnation's lease has ended).
    pub fn member_id(mut self, id: impl Into<String>) -> Self {
        self.member_id = Some(id.into());
        self
    }

    /// Where a Redis consumer group starts on a shard stream that has none (default: the beginning).
    pub fn start_from(mut self, position: StartPosition) -> Self {
        self.start_from = position;
        self
    }

    /// All timings at once.
    pub fn timings(mut self, timings: Timings) -> Self {
        self.timings = timings;
        self
    }

    /// See [`Timings::heartbeat_interval`].
    pub fn heartbeat_interval(mut self, d: Duration) -> Self {
        self.timings.heartbeat_interval = d;
        self
    }

    /// See [`Timings::member_ttl`].
    pub fn member_ttl(mut self, d: Duration) -> Self {
        self.timings.member_ttl = d;
        self
    }

    /// See [`Timings::assignment_lease`].
    pub fn assignment_lease(mut self, d: Duration) -> Self {
        self.timings.assignment_lease = d;
        self
    }

    /// See [`Timings::lease_safety_margin`].
    pub fn lease_safety_margin(mut self, d: Duration) -> Self {
        self.timings.lease_safety_margin = d;
        self
    }

    /// See [`Timings::request_timeout`].
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.timings.request_timeout = d;
        self
    }

    /// See [`Timings::read_block`].
    pub fn read_block(mut self, d: Duration) -> Self {
        self.timings.read_block = d;
        self
    }

    /// See [`Timings::drain_timeout`].
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.timings.drain_timeout = d;
        self
    }

    /// See [`Timings::read_failure_timeout`].
    pub fn read_failure_timeout(mut self, d: Duration) -> Self {
        self.timings.read_failure_timeout = d;
        self
    }

    /// See [`Timings::listener_timeout`].
    pub fn listener_timeout(mut self, d: Duration) -> Self {
        self.timings.listener_timeout = d;
        self
    }

    /// See [`Timings::retry_backoff_min`] and [`Timings::retry_backoff_max`].
    pub fn retry_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.timings.retry_backoff_min = min;
        self.timings.retry_backoff_max = max;
        self
    }

    /// Deliveries after which an entry goes to the dead-letter stream (default 10).
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n;
        self
    }

    /// Entries fetched per read (default 64).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// The message handler (required): a closure `|msg: Message| async move { ...; Ok::<_, E>(()) }` or a
    /// [`Handler`] implementation.
    pub fn handler(mut self, handler: impl Handler) -> Self {
        self.handler = Some(Arc::new(handler));
        self
    }

    /// Rebalance callbacks (optional).
    pub fn rebalance_listener(mut self, listener: impl RebalanceListener) -> Self {
        self.listener = Some(Arc::new(listener));
        self
    }

    /// Where the highest observed metadata version is kept (default: the process-wide memory, shared by every
    /// consumer and producer of the process; see [`crate::version_store`]).
    pub fn version_store(mut self, store: impl VersionStore) -> Self {
        self.version_store = Some(SharedVersionStore::new(store));
        self
    }

    /// Validates the configuration and builds the consumer. Nothing is connected yet: that happens in
    /// [`Consumer::run`].
    ///
    /// # Errors
    /// [`ConfigError`] naming the first rule broken.
    pub fn build(self) -> Result<Consumer, ConfigError> {
        let stream = StreamName::new(self.stream)?;
        let group = GroupName::new(self.group)?;
        let (member_id, member_id_generated) = match self.member_id {
            Some(id) => (MemberId::new(id)?, false),
            None => (MemberId::new(format!("member-{:016x}", rand::random::<u64>()))?, true),
        };
        let config = ConsumerConfig {
            stream,
            group,
            member_id,
            member_id_generated,
            coordinator_urls: self
                .coordinator_urls
                .into_iter()
                .map(|u| u.trim_end_matches('/').to_owned())
                .collect(),
            coordinator_token: self.coordinator_token,
            redis_url: self.redis_url.ok_or(ConfigError::MissingRedisUrl)?,
            start_from: self.start_from,
            timings: self.timings,
            max_deliveries: self.max_deliveries,
            batch_size: self.batch_size,
        };
        config.validate()?;
        let handler = self.handler.ok_or(ConfigError::MissingHandler)?;
        Ok(Consumer::from_parts(config, handler, self.listener, self.version_store))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;

    fn base() -> ConsumerBuilder {
        Consumer::builder("orders", "billing")
            .coordinator("http://127.0.0.1:7400")
            .redis("redis://127.0.0.1:6379")
            .handler(|_m: Message| async { Ok::<_, std::io::Error>(()) })
    }

    #[test]
    fn debug_and_errors_hide_the_token_and_redis_credentials() {
        let c = base()
            .redis("redis://consumer:hunter2@redis:6379")
            .coordinator_token("hunter3")
            .build()
            .unwrap();
        let text = format!("{:?}", c.config());
        assert!(!text.contains("hunter"), "{text}");
        assert!(text.contains("redis://***@redis:6379"), "{text}");
        let builder = format!("{:?}", base().redis("consumer:hunter2@redis:6379"));
        assert!(!builder.contains("hunter"), "{builder}");
        let e = base().redis("consumer:hunter2@redis:6379").build().unwrap_err();
        assert!(matches!(e, ConfigError::InvalidRedisUrl { .. }), "{e}");
        assert!(!e.to_string().contains("hunter"), "{e}");
    }

    #[test]
    fn defaults_build() {
        let c = base().build().unwrap();
        assert!(c.config().member_id_generated);
        assert!(c.config().member_id.as_str().starts_with("member-"));
        assert_eq!(c.config().start_from, StartPosition::Beginning);
        let fixed = base().member_id("worker-1").build().unwrap();
        assert_eq!(fixed.config().member_id.as_str(), "worker-1");
        assert!(!fixed.config().member_id_generated);
    }

    #[test]
    fn lease_above_ttl_is_a_build_error() {
        let e = base()
            .member_ttl(Duration::from_secs(5))
            .assignment_lease(Duration::from_secs(6))
            .build()
            .unwrap_err();
        assert!(matches!(e, ConfigError::LeaseAboveTtl { .. }), "{e}");
    }

    #[test]
    fn other_rules_are_checked() {
        let e = base().heartbeat_interval(Duration::from_secs(8)).build().unwrap_err();
        assert!(matches!(e, ConfigError::HeartbeatNotBelowLease { .. }), "{e}");
        let e = base().lease_safety_margin(Duration::from_secs(4)).build().unwrap_err();
        assert!(matches!(e, ConfigError::MarginTooLarge { .. }), "{e}");
        let e = base().request_timeout(Duration::from_secs(9)).build().unwrap_err();
        assert!(matches!(e, ConfigError::RequestTimeoutNotBelowLease { .. }), "{e}");
        let e = base().read_block(Duration::ZERO).build().unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::Invalid {
                    setting: "read_block",
                    ..
                }
            ),
            "{e}"
        );
        let e = base().drain_timeout(Duration::MAX).build().unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::Invalid {
                    setting: "drain_timeout",
                    ..
                }
            ),
            "{e}"
        );
        let e = base().max_deliveries(0).build().unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::Invalid {
                    setting: "max_deliveries",
                    ..
                }
            ),
            "{e}"
        );
        let e = base().coordinator("ftp://x").build().unwrap_err();
        assert!(matches!(e, ConfigError::InvalidCoordinatorUrl(_)), "{e}");
        let e = base().redis("nope://").build().unwrap_err();
        assert!(matches!(e, ConfigError::InvalidRedisUrl { .. }), "{e}");
        let e = base().member_id("a:b").build().unwrap_err();
        assert!(matches!(e, ConfigError::InvalidName(_)), "{e}");
    }

    #[test]
    fn required_parts_are_required() {
        let e = Consumer::builder("s", "g").redis("redis://x").build().unwrap_err();
        assert!(matches!(e, ConfigError::MissingCoordinator), "{e}");
        let e = Consumer::builder("s", "g").coordinator("http://x").build().unwrap_err();
        assert!(matches!(e, ConfigError::MissingRedisUrl), "{e}");
        let e = Consumer::builder("s", "g")
            .coordinator("http://x")
            .redis("redis://x")
            .build()
            .unwrap_err();
        assert!(matches!(e, ConfigError::MissingHandler), "{e}");
    }
}

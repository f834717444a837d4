//! [`ConsumerBuilder`]: the by-value builder behind [`Consumer::builder`]. `build()` checks the settings
//! ([`ConsumerConfig::validate`]) and connects to nothing: the consumer starts with [`Consumer::start`],
//! [`Consumer::spawn`] or [`Consumer::run`].

use protocol::names::{GroupName, MemberId, StreamName};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{ConsumerConfig, StartPosition, Timings, DEFAULT_BATCH_SIZE, DEFAULT_MAX_DELIVERIES};
use crate::consumer::Consumer;
use crate::error::ConfigError;
use crate::handler::{DynHandler, DynListener, Handler, RebalanceListener};
use client_core::{SharedVersionStore, VersionStore};

impl Consumer {
    /// Starts building a consumer of `group` on the logical stream `stream`.
    pub fn builder(stream: impl Into<String>, group: impl Into<String>) -> ConsumerBuilder {
        ConsumerBuilder::new(stream, group)
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
    coordinator_tls: redis_link::TlsOptions,
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

impl ConsumerBuilder {
    pub(crate) fn new(stream: impl Into<String>, group: impl Into<String>) -> Self {
        ConsumerBuilder {
            stream: stream.into(),
            group: group.into(),
            member_id: None,
            coordinator_urls: Vec::new(),
            coordinator_token: None,
            coordinator_tls: redis_link::TlsOptions::default(),
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

    /// TLS settings of `https://` coordinator URLs: a private CA ([`TlsOptions::ca_file`]), a client certificate
    /// for coordinators that require one. Without it the coordinator's certificate is verified against the
    /// system's roots. The files are read at `build()`.
    ///
    /// [`TlsOptions::ca_file`]: redis_link::TlsOptions::ca_file
    pub fn coordinator_tls(mut self, tls: redis_link::TlsOptions) -> Self {
        self.coordinator_tls = tls;
        self
    }

    /// Redis of the shard streams: one server's URL (`redis://host:port/db`), or a Redis Cluster as `cluster:`
    /// followed by the comma-separated URLs of some of its nodes (`cluster:redis://10.0.0.1:7000,redis://10.0.0.2:7000`;
    /// credentials in every URL, database 0 only). On a cluster every shard reader reads from the master of its
    /// shard's hash slot and follows `MOVED`, `ASK` and failovers.
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
            coordinator_tls: self.coordinator_tls,
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
                ConfigError::OutOfRange {
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
                ConfigError::OutOfRange {
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
                ConfigError::OutOfRange {
                    setting: "max_deliveries",
                    ..
                }
            ),
            "{e}"
        );
        let e = base()
            .retry_backoff(Duration::from_secs(2), Duration::from_secs(1))
            .build()
            .unwrap_err();
        assert!(matches!(e, ConfigError::RetryBackoffInverted { .. }), "{e}");
        let e = base().coordinator("ftp://x").build().unwrap_err();
        assert!(matches!(e, ConfigError::InvalidCoordinatorUrl(_)), "{e}");
        let e = base().redis("nope://").build().unwrap_err();
        assert!(matches!(e, ConfigError::InvalidRedisUrl { .. }), "{e}");
        let e = base().redis("cluster:redis://a:1,,redis://b:2").build().unwrap_err();
        assert!(matches!(e, ConfigError::InvalidRedisTarget(_)), "{e}");
        let e = base().redis("cluster:redis://:hunter2@a:1/4").build().unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        assert!(base().redis("cluster:redis://a:1,redis://b:2").build().is_ok());
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

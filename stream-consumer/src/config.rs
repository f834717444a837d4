//! The consumer's settings: [`ConsumerConfig`] with its [`Timings`] and [`StartPosition`], typed defaults, and
//! the cross-field rules checked once by [`ConsumerConfig::validate`]. The builder that fills them is in
//! `builder`.

use protocol::names::{GroupName, MemberId, StreamName};
use std::fmt;
use std::time::Duration;

use crate::error::ConfigError;

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

/// A validated consumer configuration (readable through [`Consumer::config`](crate::Consumer::config)). `Debug` hides the coordinator
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
    /// TLS settings of `https://` coordinator URLs (see
    /// [`ConsumerBuilder::coordinator_tls`](crate::ConsumerBuilder::coordinator_tls)).
    pub coordinator_tls: redis_link::TlsOptions,
    /// Redis of the shard streams: one server's URL, or `cluster:` and the comma-separated URLs of some of a
    /// Redis Cluster's nodes (see [`ConsumerBuilder::redis`](crate::ConsumerBuilder::redis)).
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
            .field("coordinator_tls", &self.coordinator_tls)
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
        if let Some(bad) = client_core::coord_client::first_invalid_url(&self.coordinator_urls) {
            return Err(ConfigError::InvalidCoordinatorUrl(bad.to_owned()));
        }
        client_core::coord_tls::client_config(&self.coordinator_tls).map_err(ConfigError::CoordinatorTls)?;
        if redis_link::RedisTarget::names_cluster(&self.redis_url) {
            redis_link::RedisTarget::parse(&self.redis_url).map_err(ConfigError::InvalidRedisTarget)?;
        } else {
            redis::Client::open(self.redis_url.as_str()).map_err(|source| ConfigError::InvalidRedisUrl {
                url: protocol::redact::redact_url(&self.redis_url),
                source,
            })?;
        }
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
        if let Some((setting, d)) = positive.iter().find(|(_, d)| d.is_zero()) {
            return Err(ConfigError::OutOfRange {
                setting,
                rule: "positive",
                value: format!("{d:?}"),
            });
        }
        let all = positive.into_iter().chain([
            ("lease_safety_margin", t.lease_safety_margin),
            ("retry_backoff_max", t.retry_backoff_max),
        ]);
        if let Some((setting, d)) = all.into_iter().find(|(_, d)| *d > MAX_DURATION) {
            return Err(ConfigError::OutOfRange {
                setting,
                rule: "at most one day",
                value: format!("{d:?}"),
            });
        }
        if t.read_block < Duration::from_millis(1) {
            return Err(ConfigError::OutOfRange {
                setting: "read_block",
                rule: "at least 1 ms (BLOCK 0 would block forever)",
                value: format!("{:?}", t.read_block),
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
            return Err(ConfigError::RetryBackoffInverted {
                min: t.retry_backoff_min,
                max: t.retry_backoff_max,
            });
        }
        if self.max_deliveries == 0 {
            return Err(ConfigError::OutOfRange {
                setting: "max_deliveries",
                rule: "at least 1",
                value: "0".into(),
            });
        }
        if self.batch_size == 0 {
            return Err(ConfigError::OutOfRange {
                setting: "batch_size",
                rule: "at least 1",
                value: "0".into(),
            });
        }
        Ok(())
    }
}

/// Default of [`ConsumerBuilder::max_deliveries`](crate::ConsumerBuilder::max_deliveries).
pub const DEFAULT_MAX_DELIVERIES: u32 = 10;
/// Default of [`ConsumerBuilder::batch_size`](crate::ConsumerBuilder::batch_size).
pub const DEFAULT_BATCH_SIZE: usize = 64;

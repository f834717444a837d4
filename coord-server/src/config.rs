//! Coordinator configuration: typed fields with defaults, checked once by [`Config::validate`].

use protocol::metadata::GroupTimings;
use std::net::SocketAddr;
use std::time::Duration;

/// Settings of one coordinator instance.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Redis URL (`redis://host:port/db`).
    pub redis_url: String,
    /// HTTP listen address (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// How often every group is ticked (expiry, fencing, routing adoption).
    pub tick_interval: Duration,
    /// TTL of the Redis mutex; a crashed holder blocks its group at most this long.
    pub mutex_ttl: Duration,
    /// How long a request waits for its group's mutex before answering `STORE_UNAVAILABLE`.
    pub critical_section_timeout: Duration,
    /// Largest accepted request body.
    pub body_limit_bytes: usize,
    /// Deadline of one HTTP request.
    pub request_timeout: Duration,
    /// Timings given to groups created without explicit ones.
    pub default_timings: GroupTimings,
    /// Routing lease given to producers of new streams.
    pub routing_lease: Duration,
    /// Bearer token required by admin endpoints, if set.
    pub admin_token: Option<String>,
    /// Bearer token required by consumer and producer endpoints, if set.
    pub client_token: Option<String>,
    /// How long a client may take to send a request head once its first byte arrived (slow-header defence).
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in progress (kept alive, or never used).
    pub idle_timeout: Duration,
    /// Most connections served at once, besides the probe reserve; `None` derives it from the process's open-file
    /// limit (see `server` docs).
    pub max_connections: Option<usize>,
    /// Connections reserved for `/healthz` and `/readyz` once `max_connections` is reached.
    pub probe_connections: usize,
    /// After shutdown drained the critical sections: how long open requests get to be answered before every
    /// remaining connection is dropped. Idle and half-sent connections are closed at once.
    pub shutdown_grace: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            redis_url: "redis://127.0.0.1:6379".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7400)),
            tick_interval: Duration::from_millis(250),
            mutex_ttl: Duration::from_secs(2),
            critical_section_timeout: Duration::from_millis(1500),
            body_limit_bytes: 256 * 1024,
            request_timeout: Duration::from_secs(5),
            default_timings: GroupTimings::default(),
            routing_lease: Duration::from_secs(30),
            admin_token: None,
            client_token: None,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            max_connections: None,
            probe_connections: 8,
            // Longer than the default request timeout, so a request in flight at shutdown is still answered.
            shutdown_grace: Duration::from_secs(6),
        }
    }
}

impl Config {
    /// A default configuration for the given Redis URL.
    pub fn new(redis_url: impl Into<String>) -> Self {
        Config {
            redis_url: redis_url.into(),
            ..Config::default()
        }
    }

    /// Checks the cross-field rules.
    ///
    /// # Errors
    /// A sentence naming the broken rule.
    pub fn validate(&self) -> Result<(), String> {
        if self.critical_section_timeout >= self.mutex_ttl {
            return Err("critical_section_timeout must be shorter than mutex_ttl".into());
        }
        if self.tick_interval.is_zero() {
            return Err("tick_interval must be positive".into());
        }
        if self.body_limit_bytes < 1024 {
            return Err("body_limit_bytes must be at least 1024".into());
        }
        if self.routing_lease < Duration::from_secs(1) {
            return Err("routing_lease must be at least 1 s".into());
        }
        if self.header_read_timeout.is_zero() || self.idle_timeout.is_zero() || self.shutdown_grace.is_zero() {
            return Err("header_read_timeout, idle_timeout and shutdown_grace must be positive".into());
        }
        if self.max_connections == Some(0) || self.probe_connections == 0 {
            return Err("max_connections and probe_connections must be at least 1".into());
        }
        self.default_timings.validate()
    }
}

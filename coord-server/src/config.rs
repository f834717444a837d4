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
        self.check_timings(&self.default_timings)
    }

    /// Checks a group's timings against this coordinator: the protocol's rules, and an assignment lease that
    /// outlasts the longest a healthy member can be kept from a successful heartbeat by the group's mutex: a dead
    /// holder's mutex lives `mutex_ttl`, and a request then waits up to `critical_section_timeout` for it.
    ///
    /// # Errors
    /// A sentence naming the broken rule.
    pub fn check_timings(&self, timings: &GroupTimings) -> Result<(), String> {
        timings.validate()?;
        let blocked = self.mutex_ttl + self.critical_section_timeout;
        if u128::from(timings.assignment_lease_ms) < blocked.as_millis() {
            return Err(format!(
                "assignmentLeaseMs ({}) must be at least mutex_ttl + critical_section_timeout ({} ms) of this \
                 coordinator: a mutex left by a failed section would otherwise end healthy members' leases",
                timings.assignment_lease_ms,
                blocked.as_millis()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timings(lease_ms: u64) -> GroupTimings {
        GroupTimings {
            member_ttl_ms: lease_ms.max(10_000),
            heartbeat_interval_ms: 200,
            rebalance_timeout_ms: 30_000,
            assignment_lease_ms: lease_ms,
        }
    }

    #[test]
    fn the_lease_must_cover_the_mutex_ttl_and_the_wait_for_it() {
        let config = Config::default();
        // Defaults: 2 s TTL + 1.5 s wait.
        assert!(config.check_timings(&timings(3_500)).is_ok());
        let err = config.check_timings(&timings(3_499)).expect_err("refused");
        assert!(err.contains("3500 ms"), "{err}");
        assert!(config.check_timings(&timings(2_500)).is_err());
    }

    #[test]
    fn the_rule_follows_the_configured_mutex() {
        let config = Config {
            mutex_ttl: Duration::from_millis(900),
            critical_section_timeout: Duration::from_millis(600),
            ..Config::default()
        };
        assert!(config.check_timings(&timings(1_500)).is_ok());
        assert!(config.check_timings(&timings(1_499)).is_err());
    }

    #[test]
    fn protocol_rules_still_apply() {
        let mut t = timings(8_000);
        t.member_ttl_ms = 7_000;
        assert!(
            Config::default().check_timings(&t).is_err(),
            "lease above the member TTL"
        );
    }

    #[test]
    fn a_configuration_whose_default_timings_break_the_rule_is_refused() {
        let config = Config {
            default_timings: timings(3_000),
            ..Config::default()
        };
        let err = config.validate().expect_err("refused");
        assert!(err.contains("mutex_ttl"), "{err}");
        assert!(Config::default().validate().is_ok());
    }
}

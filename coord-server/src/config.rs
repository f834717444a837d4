//! Coordinator configuration: typed fields with defaults, checked once by [`Config::validate`].

use protocol::metadata::GroupTimings;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::auth::{self, Credentials, Grant, Role};
use crate::quota::principals::Principals;
use crate::quota::Quota;

/// `text` (a Redis target) with every password hidden, for logs and errors; also for a target that does not
/// parse (each comma-separated part redacted on its own).
pub fn redact_redis_target(text: &str) -> String {
    match redis_link::RedisTarget::parse(text) {
        Ok(target) => target.redacted(),
        Err(_) => text
            .split(',')
            .map(protocol::redact::redact_url)
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// The PEM files of HTTPS on the API listener.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerTls {
    /// The server's certificate chain (leaf first).
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
    /// When set, clients must present a certificate that chains to a CA of this file (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
}

impl ServerTls {
    /// HTTPS with `cert` and `key`, no client certificates asked for.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> ServerTls {
        ServerTls {
            cert_file: cert.into(),
            key_file: key.into(),
            client_ca_file: None,
        }
    }

    /// Requires client certificates issued by a CA of the PEM file at `ca`.
    #[must_use]
    pub fn client_ca(mut self, ca: impl Into<PathBuf>) -> ServerTls {
        self.client_ca_file = Some(ca.into());
        self
    }
}

/// Settings of one coordinator instance. `Debug` hides the tokens and the Redis URL's credentials.
#[derive(Clone)]
#[non_exhaustive]
pub struct Config {
    /// The Redis to use: one server's URL (`redis://host:port/db`), or a Redis Cluster as `cluster:` followed by
    /// the comma-separated URLs of some of its nodes (`cluster:redis://h1:7000,redis://h2:7000`; the other nodes
    /// are discovered, every URL's database must be 0). See [`redis_link::RedisTarget`].
    pub redis_url: String,
    /// A Redis of its own for the coordinator's metadata (`redis-stream:coord:*`: group and routing hashes,
    /// liveness, mutexes, indexes), same forms as `redis_url`; `redis_url` then holds only what must sit next to
    /// the stream data (shard streams, shard records and fences). `None`: one Redis holds everything. See
    /// [`crate::store::Store::connect_split`].
    pub metadata_redis_url: Option<String>,
    /// HTTP listen address (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// Listen address of the probe listener, which serves only `/healthz`, `/readyz` and `/metrics` with
    /// connection slots of its own, so a flood of client connections on `listen` cannot crowd out the probes
    /// (see `server` docs). `None` (the default): no probe listener; `listen` serves the three routes either way.
    pub probe_listen: Option<SocketAddr>,
    /// HTTPS on `listen` (the probe listener stays plain HTTP). `None` (the default): plain HTTP. See
    /// [`crate::server::tls`].
    pub tls: Option<ServerTls>,
    /// How often the TLS files are looked at for a change (a rotated certificate); SIGHUP reloads at once.
    /// Default 5 s.
    pub tls_reload_interval: Duration,
    /// How often the tick loop runs: each run visits the groups whose deadline has come (the due index, see
    /// [`crate::due`]) and a slice of the safety sweep.
    pub tick_interval: Duration,
    /// Every group is visited at least this often whatever the due index says (the safety sweep, spread over the
    /// period): the bound on how late a member expires when the index was lost (see [`crate::due`]).
    pub due_sweep_period: Duration,
    /// Most due groups one tick visits; the rest stay due for the next tick.
    pub due_batch: usize,
    /// Most decoded aggregates this process caches; beyond it the least recently used are dropped (and read
    /// from Redis again on their next use).
    pub max_cached_aggregates: usize,
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
    /// Bearer token required by admin endpoints, if set: an admin grant on every stream (see [`crate::auth`]).
    pub admin_token: Option<String>,
    /// Bearer token required by consumer and producer endpoints, if set: consumer and producer grants on every
    /// stream.
    pub client_token: Option<String>,
    /// Token table: tokens with a role on a stream-name prefix. Once non-empty, every API route needs a token.
    pub tokens: Vec<Grant>,
    /// Quotas of every token that its token table lines do not set (see [`crate::quota`]). An open coordinator
    /// (no token configured) has no tenants to tell apart and enforces none.
    pub quota: Quota,
    /// Accept a listen address that is not loopback although nothing protects the admin routes.
    pub insecure_no_admin_token: bool,
    /// Accept a Redis `maxmemory-policy` other than `noeviction` (see [`crate::memory_policy`]): the instance then
    /// reports ready and creates groups although Redis may evict their keys. Off by default.
    pub accept_eviction_policy: bool,
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

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hidden = |t: &Option<String>| t.as_ref().map(|_| "***");
        f.debug_struct("Config")
            .field("redis_url", &redact_redis_target(&self.redis_url))
            .field(
                "metadata_redis_url",
                &self.metadata_redis_url.as_deref().map(redact_redis_target),
            )
            .field("listen", &self.listen)
            .field("probe_listen", &self.probe_listen)
            .field("tls", &self.tls)
            .field("tls_reload_interval", &self.tls_reload_interval)
            .field("tick_interval", &self.tick_interval)
            .field("due_sweep_period", &self.due_sweep_period)
            .field("due_batch", &self.due_batch)
            .field("max_cached_aggregates", &self.max_cached_aggregates)
            .field("mutex_ttl", &self.mutex_ttl)
            .field("critical_section_timeout", &self.critical_section_timeout)
            .field("body_limit_bytes", &self.body_limit_bytes)
            .field("request_timeout", &self.request_timeout)
            .field("default_timings", &self.default_timings)
            .field("routing_lease", &self.routing_lease)
            .field("admin_token", &hidden(&self.admin_token))
            .field("client_token", &hidden(&self.client_token))
            .field("tokens", &self.tokens)
            .field("quota", &self.quota)
            .field("insecure_no_admin_token", &self.insecure_no_admin_token)
            .field("accept_eviction_policy", &self.accept_eviction_policy)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_connections", &self.max_connections)
            .field("probe_connections", &self.probe_connections)
            .field("shutdown_grace", &self.shutdown_grace)
            .finish_non_exhaustive()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            redis_url: "redis://127.0.0.1:6379".into(),
            metadata_redis_url: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 7400)),
            probe_listen: None,
            tls: None,
            tls_reload_interval: Duration::from_secs(5),
            tick_interval: Duration::from_millis(250),
            due_sweep_period: crate::due::SWEEP_PERIOD,
            due_batch: 1_000,
            max_cached_aggregates: 10_000,
            mutex_ttl: Duration::from_secs(2),
            critical_section_timeout: Duration::from_millis(1500),
            body_limit_bytes: 256 * 1024,
            request_timeout: Duration::from_secs(5),
            default_timings: GroupTimings::default(),
            routing_lease: Duration::from_secs(30),
            admin_token: None,
            client_token: None,
            tokens: Vec::new(),
            quota: Quota::default(),
            insecure_no_admin_token: false,
            accept_eviction_policy: false,
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
    /// The Redis target [`Config::redis_url`] names.
    ///
    /// # Errors
    /// [`redis_link::TargetError`]: empty, a malformed URL, too many seeds, a cluster seed with a database.
    pub fn redis_target(&self) -> Result<redis_link::RedisTarget, redis_link::TargetError> {
        redis_link::RedisTarget::parse(&self.redis_url)
    }

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
        self.redis_target().map_err(|e| format!("redis_url: {e}"))?;
        if let Some(url) = &self.metadata_redis_url {
            redis_link::RedisTarget::parse(url).map_err(|e| format!("metadata_redis_url: {e}"))?;
        }
        if self.critical_section_timeout >= self.mutex_ttl {
            return Err("critical_section_timeout must be shorter than mutex_ttl".into());
        }
        if self.tls.is_some() && self.tls_reload_interval.is_zero() {
            return Err("tls_reload_interval must be positive".into());
        }
        if self.tick_interval.is_zero() {
            return Err("tick_interval must be positive".into());
        }
        if self.due_sweep_period.is_zero() || self.due_batch == 0 {
            return Err("due_sweep_period and due_batch must be positive".into());
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
        if self.probe_listen == Some(self.listen) && self.listen.port() != 0 {
            return Err(format!("probe_listen must differ from listen ({})", self.listen));
        }
        self.validate_auth()?;
        self.quota.validate().map_err(|e| format!("default {e}"))?;
        Principals::new(self)?;
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

    /// Every credential this configuration accepts (see [`crate::auth`]).
    pub fn credentials(&self) -> Credentials<'_> {
        Credentials {
            tokens: &self.tokens,
            admin_token: self.admin_token.as_deref(),
            client_token: self.client_token.as_deref(),
        }
    }

    /// The auth rules: well-formed single tokens, and no admin route open to the network by accident.
    fn validate_auth(&self) -> Result<(), String> {
        for (name, token) in [("admin_token", &self.admin_token), ("client_token", &self.client_token)] {
            if let Some(token) = token {
                auth::check_token(token).map_err(|e| format!("{name}: {e}"))?;
            }
        }
        // Open means no token can authorise the admin routes; a token table without an admin line closes them.
        if !self.listen.ip().is_loopback()
            && !auth::role_is_protected(self.credentials(), Role::Admin)
            && !self.insecure_no_admin_token
        {
            return Err(format!(
                "listen address {} is not loopback and no admin token is set: anyone who reaches the port could \
                 fence members, recreate groups and add shards. Set an admin token (--admin-token-file, \
                 COORD_ADMIN_TOKEN, or an admin line in --tokens-file), listen on loopback, or accept the risk \
                 with --insecure-no-admin-token",
                self.listen
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::StreamScope;

    fn listening_on(addr: &str) -> Config {
        Config {
            listen: addr.parse().expect("literal address"),
            ..Config::default()
        }
    }

    #[test]
    fn a_non_loopback_listener_needs_an_admin_token_or_the_insecure_flag() {
        for open in ["0.0.0.0:7400", "10.1.2.3:7400", "[::]:7400"] {
            let err = listening_on(open).validate().expect_err(open);
            assert!(err.contains("--insecure-no-admin-token"), "{err}");
        }
        for loopback in ["127.0.0.1:7400", "[::1]:0"] {
            listening_on(loopback).validate().expect(loopback);
        }
        let mut client_only = listening_on("0.0.0.0:7400");
        client_only.client_token = Some("client".into());
        assert!(
            client_only.validate().is_err(),
            "a client token does not protect admin routes"
        );

        let mut single = listening_on("0.0.0.0:7400");
        single.admin_token = Some("admin".into());
        single.validate().expect("admin token");
        let mut table = listening_on("0.0.0.0:7400");
        table.tokens = vec![Grant::new(Role::Admin, StreamScope::All, "admin").expect("grant")];
        table.validate().expect("admin grant");
        let mut locked = listening_on("0.0.0.0:7400");
        locked.tokens = vec![Grant::new(Role::Consumer, StreamScope::All, "client").expect("grant")];
        locked
            .validate()
            .expect("a table without admin lines closes the admin routes");
        let mut insecure = listening_on("0.0.0.0:7400");
        insecure.insecure_no_admin_token = true;
        insecure.validate().expect("explicitly insecure");
    }

    #[test]
    fn the_probe_listener_needs_an_address_of_its_own() {
        let mut config = listening_on("127.0.0.1:7400");
        config.probe_listen = Some(config.listen);
        let err = config.validate().expect_err("same address");
        assert!(err.contains("probe_listen"), "{err}");
        config.probe_listen = Some("0.0.0.0:7401".parse().expect("literal address"));
        config.validate().expect("a port of its own, on any interface");
        let mut any_ports = listening_on("127.0.0.1:0");
        any_ports.probe_listen = Some(any_ports.listen);
        any_ports.validate().expect("port 0 picks two free ports");
    }

    #[test]
    fn debug_hides_tokens_and_redis_credentials() {
        let mut config = Config::new("user:hunter2@redis:6379");
        config.admin_token = Some("hunter3".into());
        config.client_token = Some("hunter4".into());
        config.tokens = vec![Grant::new(Role::Consumer, StreamScope::All, "hunter5").expect("grant")];
        let text = format!("{config:?}");
        assert!(!text.contains("hunter"), "{text}");
        assert!(text.contains("***@redis:6379"), "{text}");
    }

    #[test]
    fn the_redis_target_is_one_url_or_cluster_seeds() {
        let cluster = Config::new("cluster:redis://:pw1@10.0.0.1:7000,redis://:pw2@10.0.0.2:7000");
        cluster.validate().expect("a cluster target");
        assert!(cluster.redis_target().unwrap().is_cluster());
        let text = format!("{cluster:?}");
        assert!(!text.contains("pw1") && !text.contains("pw2"), "{text}");
        assert!(text.contains("10.0.0.2:7000"), "{text}");
        for (bad, why) in [
            ("", "no redis url"),
            ("cluster:", "seed"),
            ("cluster:redis://a:1/2", "database"),
            ("http://a:1", "a:1"),
        ] {
            let err = Config::new(bad).validate().expect_err(bad);
            assert!(err.starts_with("redis_url: "), "{err}");
            assert!(err.to_lowercase().contains(why), "{bad}: {err}");
        }
        let err = Config::new("cluster:redis://:secret@a:1/3").validate().unwrap_err();
        assert!(!err.contains("secret"), "{err}");
        assert!(
            !redact_redis_target("cluster:redis://:secret@a:1,,bad").contains("secret"),
            "an unparsable target is redacted too"
        );
    }

    #[test]
    fn unusable_quotas_are_refused() {
        let zero = Config {
            quota: Quota {
                groups: 0,
                ..Quota::default()
            },
            ..Config::default()
        };
        assert!(zero.validate().unwrap_err().contains("default quota groups"));
        let conflicting = Config {
            tokens: Grant::parse_table("admin:a.:t groups=1\nconsumer:a.:t groups=2").expect("table"),
            ..Config::default()
        };
        assert!(conflicting.validate().unwrap_err().contains("groups="));
    }

    #[test]
    fn a_metadata_redis_is_checked_and_hidden_like_the_data_redis() {
        let mut config = Config::new("redis://a:1");
        config.metadata_redis_url = Some("redis://:secret@m:2".into());
        config.validate().expect("two single servers");
        assert!(!format!("{config:?}").contains("secret"));
        config.metadata_redis_url = Some("cluster:redis://:secret@m:2/3".into());
        let err = config.validate().expect_err("a cluster seed with a database");
        assert!(
            err.starts_with("metadata_redis_url: ") && !err.contains("secret"),
            "{err}"
        );
    }

    #[test]
    fn unusable_single_tokens_are_refused() {
        let mut config = Config {
            admin_token: Some("two words".into()),
            ..Config::default()
        };
        assert!(config.validate().is_err());
        config.admin_token = Some(String::new());
        assert!(config.validate().is_err());
    }

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

//! The consumer's metrics, recorded through the [`metrics`](https://docs.rs/metrics/0.24) facade so the
//! application chooses the exporter (Prometheus, StatsD, OpenTelemetry, ...).
//!
//! Recording needs the `metrics` cargo feature (on by default). Without it the names below still exist, and
//! nothing is recorded and the `metrics` crate is not compiled in. With it and no recorder installed, every
//! update is a call into the facade's no-op recorder.
//!
//! # Installing a recorder
//! The consumer registers its handles once, when it is **built** ([`ConsumerBuilder::build`](crate::ConsumerBuilder::build)): install the
//! global recorder (`metrics::set_global_recorder`, or an exporter's `install()`) before that. A consumer built
//! earlier records into the recorder that was installed at its build time (none: nothing is recorded).
//!
//! # Names
//! Labels: `stream` and `group` on every series, `status` on [`names::HEARTBEATS`]. No label carries a member
//! id or a shard id. Several members of one group in one process share their series: gauges show the member
//! that updated them last, counters add up. Run one member per group per process (the usual deployment) when
//! the gauges matter.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | [`names::ASSIGNMENT_LEASE_REMAINING`] | gauge | `stream`, `group` | seconds left on the assignment lease as of the last update; 0 once expired, lost or closed |
//! | [`names::REVOKING_SHARDS`] | gauge | `stream`, `group` | shards in local revoking state (draining, or revoked and waiting for the coordinator to release them) |
//! | [`names::READING_SHARDS`] | gauge | `stream`, `group` | shards being read |
//! | [`names::MAX_OBSERVED_VERSION`] | gauge | `stream`, `group` | highest metadata version this consumer observed |
//! | [`names::HEARTBEATS`] | counter | `stream`, `group`, `status` | heartbeat outcomes: the wire status, or [`UNREACHABLE`] / [`INVALID_RESPONSE`] / [`CLIENT_ERROR`] |
//! | [`names::LEASE_EXPIRIES`] | counter | `stream`, `group` | times the lease ran out and every reader was stopped |
//! | [`names::REJOINS`] | counter | `stream`, `group` | times the member was fenced or forgotten, stopped everything and rejoined |
//! | [`names::REBALANCES`] | counter | `stream`, `group` | answers that started or drained at least one shard of this member |
//! | [`names::ENTRIES_HANDLED`] | counter | `stream`, `group` | entries the handler accepted (`Ok`) |
//! | [`names::HANDLER_ERRORS`] | counter | `stream`, `group` | handler attempts that returned an error or panicked |
//! | [`names::DEAD_LETTERS`] | counter | `stream`, `group` | entries moved to a dead-letter stream |
//! | [`names::HANDLERS_EXPIRED`] | counter | `stream`, `group` | handlers dropped because the assignment lease ran out while they ran (their result did not count) |
//! | [`names::REDIS_GIVE_BACKS`] | counter | `stream`, `group` | times the member gave its shards back (left the group) because a reader could not read from Redis for longer than `Timings::read_failure_timeout` |
//! | [`names::VERSION_STORE_FAILURES`] | counter | `stream`, `group` | failed writes of the highest observed metadata version to the version store (each retry counts) |
//! | [`names::VERSION_UNPERSISTED`] | gauge | `stream`, `group` | 1 from a failed version-store write until a write succeeds: a restart now would forget the highest observed version |
//!
//! # When values change
//! The gauges are set whenever the consumer publishes a new [`ConsumerStatus`](crate::ConsumerStatus): after
//! every heartbeat answer or failure, a lease expiry, a reader that stopped, a rejoin, and on close. They cost no
//! Redis or coordinator round trip. The lease gauge is therefore "as of the last update": while the coordinator
//! is unreachable it goes down at each failed retry (at least once per heartbeat interval), and it is set to 0
//! the moment the lease expires while shards are being read. A closed consumer leaves its gauges at 0; a process
//! that keeps running after closing a consumer should let its exporter drop idle series (for example
//! `metrics-exporter-prometheus`'s `idle_timeout`), or the lease alert keeps seeing 0.
//! Counters are incremented where [`HeartbeatCounters`](crate::HeartbeatCounters) are, and in the shard readers.

use client_core::CoordError;
use protocol::names::{GroupName, StreamName};
use protocol::Status;
use std::time::Duration;

// One copy of the handles for both SDKs, chosen by this crate's own feature (see `client_core::metrics`).
#[cfg(feature = "metrics")]
use client_core::metrics::facade as handles;
#[cfg(not(feature = "metrics"))]
use client_core::metrics::noop as handles;
use handles::{Counter, Gauge};

/// The metric names of the consumer. Every name starts with `redis_stream_consumer_`.
pub mod names {
    /// Gauge, seconds: time left on the assignment lease as of the last update (0 when none is held).
    pub const ASSIGNMENT_LEASE_REMAINING: &str = "redis_stream_consumer_assignment_lease_remaining_seconds";
    /// Gauge: shards in local revoking state (draining or revoked, not yet released).
    pub const REVOKING_SHARDS: &str = "redis_stream_consumer_revoking_shards";
    /// Gauge: shards being read.
    pub const READING_SHARDS: &str = "redis_stream_consumer_reading_shards";
    /// Gauge: the highest metadata version this consumer observed (also through its version store).
    pub const MAX_OBSERVED_VERSION: &str = "redis_stream_consumer_max_observed_version";
    /// Counter, label `status`: heartbeat outcomes as the consumer saw them.
    pub const HEARTBEATS: &str = "redis_stream_consumer_heartbeats_total";
    /// Counter: times the assignment lease ran out and every reader was stopped.
    pub const LEASE_EXPIRIES: &str = "redis_stream_consumer_lease_expiries_total";
    /// Counter: times the member lost its assignment (fenced or unknown) and rejoined with epoch 0.
    pub const REJOINS: &str = "redis_stream_consumer_rejoins_total";
    /// Counter: coordinator answers that started or drained at least one shard of this member.
    pub const REBALANCES: &str = "redis_stream_consumer_rebalances_total";
    /// Counter: entries whose handler returned `Ok`.
    pub const ENTRIES_HANDLED: &str = "redis_stream_consumer_entries_handled_total";
    /// Counter: handler attempts that returned an error or panicked (each retry counts).
    pub const HANDLER_ERRORS: &str = "redis_stream_consumer_handler_errors_total";
    /// Counter: entries appended to a dead-letter stream.
    pub const DEAD_LETTERS: &str = "redis_stream_consumer_dead_letters_total";
    /// Counter: failed writes of the highest observed metadata version to the version store.
    pub const VERSION_STORE_FAILURES: &str = "redis_stream_consumer_version_store_failures_total";
    /// Gauge: 1 while the highest observed metadata version is not persisted after a failed write.
    pub const VERSION_UNPERSISTED: &str = "redis_stream_consumer_version_unpersisted";

    /// Counter: handlers dropped because the assignment lease ran out while they ran.
    pub const HANDLERS_EXPIRED: &str = "redis_stream_consumer_handlers_expired_total";
    /// Counter: times the member gave its shards back because it could not read from Redis.
    pub const REDIS_GIVE_BACKS: &str = "redis_stream_consumer_redis_give_backs_total";

    /// Every name above.
    pub const ALL: [&str; 15] = [
        ASSIGNMENT_LEASE_REMAINING,
        REVOKING_SHARDS,
        READING_SHARDS,
        MAX_OBSERVED_VERSION,
        HEARTBEATS,
        LEASE_EXPIRIES,
        REJOINS,
        REBALANCES,
        ENTRIES_HANDLED,
        HANDLER_ERRORS,
        DEAD_LETTERS,
        HANDLERS_EXPIRED,
        REDIS_GIVE_BACKS,
        VERSION_STORE_FAILURES,
        VERSION_UNPERSISTED,
    ];
}

/// `status` label of a heartbeat that reached no coordinator (connection refused, reset, timeout).
pub const UNREACHABLE: &str = "UNREACHABLE";
/// `status` label of an answer that was not the coordinator's JSON (a proxy, a version mismatch).
pub const INVALID_RESPONSE: &str = "INVALID_RESPONSE";
/// `status` label of a heartbeat the client could not send (its configuration).
pub const CLIENT_ERROR: &str = "CLIENT_ERROR";

/// Every value of the `status` label: the wire statuses, then the client-side outcomes. All are registered at
/// build time, so each series exists from 0 and `rate()` sees the first failure.
///
/// ```
/// use stream_consumer::metrics::{heartbeat_statuses, UNREACHABLE};
///
/// // e.g. one alert rule per status label.
/// let statuses: Vec<&str> = heartbeat_statuses().collect();
/// assert!(statuses.contains(&"OK"));
/// assert!(statuses.contains(&UNREACHABLE));
/// ```
pub fn heartbeat_statuses() -> impl Iterator<Item = &'static str> {
    Status::ALL
        .iter()
        .map(|s| s.as_str())
        .chain([UNREACHABLE, INVALID_RESPONSE, CLIENT_ERROR])
}

/// The `status` label of a failed heartbeat.
pub(crate) fn failure_status(e: &CoordError) -> &'static str {
    match e {
        CoordError::Status { status, .. } => status.as_str(),
        CoordError::Unreachable { .. } => UNREACHABLE,
        CoordError::Decode { .. } => INVALID_RESPONSE,
        _ => CLIENT_ERROR,
    }
}

/// The handles of one consumer, registered once at build time (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct ConsumerMetrics {
    lease_remaining: Gauge,
    revoking: Gauge,
    reading: Gauge,
    max_observed: Gauge,
    /// One counter per `status` label value, in [`heartbeat_statuses`] order.
    heartbeats: Vec<(&'static str, Counter)>,
    lease_expiries: Counter,
    rejoins: Counter,
    rebalances: Counter,
    entries_handled: Counter,
    handler_errors: Counter,
    dead_letters: Counter,
    handlers_expired: Counter,
    redis_give_backs: Counter,
    store_failures: Counter,
    unpersisted: Gauge,
}

impl ConsumerMetrics {
    /// Registers every series of `stream`/`group` with the recorder installed now.
    pub(crate) fn new(stream: &StreamName, group: &GroupName) -> Self {
        describe::describe();
        let labels = [("stream", stream.to_string()), ("group", group.to_string())];
        let gauge = |name| handles::gauge(name, &labels);
        let counter = |name| handles::counter(name, &labels);
        ConsumerMetrics {
            lease_remaining: gauge(names::ASSIGNMENT_LEASE_REMAINING),
            revoking: gauge(names::REVOKING_SHARDS),
            reading: gauge(names::READING_SHARDS),
            max_observed: gauge(names::MAX_OBSERVED_VERSION),
            heartbeats: heartbeat_statuses()
                .map(|status| {
                    let labels = [
                        ("stream", stream.to_string()),
                        ("group", group.to_string()),
                        ("status", status.to_owned()),
                    ];
                    (status, handles::counter(names::HEARTBEATS, &labels))
                })
                .collect(),
            lease_expiries: counter(names::LEASE_EXPIRIES),
            rejoins: counter(names::REJOINS),
            rebalances: counter(names::REBALANCES),
            entries_handled: counter(names::ENTRIES_HANDLED),
            handler_errors: counter(names::HANDLER_ERRORS),
            dead_letters: counter(names::DEAD_LETTERS),
            handlers_expired: counter(names::HANDLERS_EXPIRED),
            redis_give_backs: counter(names::REDIS_GIVE_BACKS),
            store_failures: counter(names::VERSION_STORE_FAILURES),
            unpersisted: gauge(names::VERSION_UNPERSISTED),
        }
    }

    /// Sets the gauges from the state the consumer is about to publish.
    pub(crate) fn status(&self, lease_remaining: Duration, reading: usize, revoking: usize, max_observed: u64) {
        self.lease_remaining.set(lease_remaining.as_secs_f64());
        self.reading.set(reading as f64);
        self.revoking.set(revoking as f64);
        // Versions stay far below 2^53: exact as f64.
        self.max_observed.set(max_observed as f64);
    }

    /// A heartbeat outcome, labelled `status` (a value of [`heartbeat_statuses`]).
    pub(crate) fn heartbeat(&self, status: &str) {
        if let Some((_, c)) = self.heartbeats.iter().find(|(s, _)| *s == status) {
            c.increment(1);
        }
    }

    pub(crate) fn lease_expired(&self) {
        self.lease_expiries.increment(1);
    }

    pub(crate) fn rejoined(&self) {
        self.rejoins.increment(1);
    }

    pub(crate) fn rebalanced(&self) {
        self.rebalances.increment(1);
    }

    pub(crate) fn entry_handled(&self) {
        self.entries_handled.increment(1);
    }

    pub(crate) fn handler_failed(&self) {
        self.handler_errors.increment(1);
    }

    pub(crate) fn dead_lettered(&self) {
        self.dead_letters.increment(1);
    }

    pub(crate) fn handler_expired(&self) {
        self.handlers_expired.increment(1);
    }

    pub(crate) fn gave_back_for_redis(&self) {
        self.redis_give_backs.increment(1);
    }
}

/// The version persister's reports (see [`client_core::persist`]).
impl client_core::PersistObserver for ConsumerMetrics {
    fn failed(&self, _version: u64, _error: &client_core::VersionStoreError) {
        self.store_failures.increment(1);
        self.unpersisted.set(1.0);
    }

    fn persisted(&self, _version: u64) {
        self.unpersisted.set(0.0);
    }
}

/// Descriptions for exporters that publish them (`# HELP`), when the feature is on.
#[cfg(feature = "metrics")]
mod describe {
    use super::names;
    use ::metrics::{describe_counter, describe_gauge, Unit};

    /// Descriptions for exporters that publish them (`# HELP`). Idempotent.
    pub(super) fn describe() {
        describe_gauge!(
            names::ASSIGNMENT_LEASE_REMAINING,
            Unit::Seconds,
            "Time left on the consumer's assignment lease as of the last update (0: every reader stopped)."
        );
        describe_gauge!(
            names::REVOKING_SHARDS,
            "Shards in local revoking state (draining, or revoked and not yet released)."
        );
        describe_gauge!(names::READING_SHARDS, "Shards the consumer is reading.");
        describe_gauge!(
            names::MAX_OBSERVED_VERSION,
            "Highest metadata version the consumer observed."
        );
        describe_counter!(
            names::HEARTBEATS,
            "Heartbeat outcomes by wire status, or UNREACHABLE / INVALID_RESPONSE / CLIENT_ERROR."
        );
        describe_counter!(
            names::LEASE_EXPIRIES,
            "Times the assignment lease ran out and every reader was stopped."
        );
        describe_counter!(
            names::REJOINS,
            "Times the member was fenced or forgotten and rejoined with epoch 0."
        );
        describe_counter!(
            names::REBALANCES,
            "Coordinator answers that started or drained at least one shard of this member."
        );
        describe_counter!(names::ENTRIES_HANDLED, "Entries the handler accepted.");
        describe_counter!(
            names::HANDLER_ERRORS,
            "Handler attempts that returned an error or panicked."
        );
        describe_counter!(names::DEAD_LETTERS, "Entries moved to a dead-letter stream.");
        describe_counter!(
            names::HANDLERS_EXPIRED,
            "Handlers dropped because the assignment lease ran out while they ran."
        );
        describe_counter!(
            names::REDIS_GIVE_BACKS,
            "Times the member gave its shards back because a reader could not read from Redis for too long."
        );
        describe_counter!(
            names::VERSION_STORE_FAILURES,
            "Failed writes of the highest observed metadata version to the version store (retried until one succeeds)."
        );
        describe_gauge!(
            names::VERSION_UNPERSISTED,
            "1 while the highest observed metadata version is not persisted after a failed version-store write."
        );
    }
}

/// Nothing to describe when the feature is off.
#[cfg(not(feature = "metrics"))]
mod describe {
    pub(super) fn describe() {}
}

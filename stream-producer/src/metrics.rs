//! The producer's metrics, recorded through the [`metrics`](https://docs.rs/metrics/0.24) facade so the
//! application chooses the exporter (Prometheus, StatsD, OpenTelemetry, ...).
//!
//! Recording needs the `metrics` cargo feature (on by default). Without it the names below still exist, and
//! nothing is recorded and the `metrics` crate is not compiled in. With it and no recorder installed, every
//! update is a call into the facade's no-op recorder.
//!
//! # Installing a recorder
//! The producer registers its handles once, when it is **built** ([`ProducerBuilder::build`](crate::ProducerBuilder::build)): install the
//! global recorder (`metrics::set_global_recorder`, or an exporter's `install()`) before that. A producer built
//! earlier records into the recorder that was installed at its build time (none: nothing is recorded).
//!
//! # Names
//! Labels: `stream` on every series; `reason` on [`names::PUBLISH_FAILURES`]; `outcome` on [`names::RECORDS`].
//! No label carries a key, a shard or an entry id. Several producers of one stream in one process share their
//! series: gauges show the producer that updated them last, counters add up.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | [`names::ROUTING_CACHE_AGE`] | gauge | `stream` | seconds since the refresh that last returned or renewed the cached routing was sent, as of the last update; keeps growing after the lease ended |
//! | [`names::ROUTING_LEASE_REMAINING`] | gauge | `stream` | seconds left on the routing lease as of the last update; 0: publishes fail closed |
//! | [`names::ROUTING_VERSION`] | gauge | `stream` | routing version of the cached routing |
//! | [`names::ROUTING_REFRESHES`] | counter | `stream` | successful refreshes (`OK` or `SYNC_METADATA`) |
//! | [`names::ROUTING_REFRESH_FAILURES`] | counter | `stream` | failed refreshes (no coordinator, an error answer, an unexpected status) |
//! | [`names::ROUTING_ROLLBACKS`] | counter | `stream` | `SYNC_METADATA` answers that changed the routing in use |
//! | [`names::PUBLISH_FAILURES`] | counter | `stream`, `reason` | publishes refused before writing anything: `reason="routing_expired"` (the lease ended), `"no_routing"` (never fetched) |
//! | [`names::RECORDS`] | counter | `stream`, `outcome` | records by write outcome: `outcome="written"`, `"not_written"`, `"unknown"` ([`WriteState`](crate::WriteState)) |
//! | [`names::VERSION_STORE_FAILURES`] | counter | `stream` | failed writes of the highest observed routing version to the version store (each retry counts) |
//! | [`names::VERSION_UNPERSISTED`] | gauge | `stream` | 1 from a failed version-store write until a write succeeds: a restart now would forget the highest observed version |
//!
//! # When values change
//! No metric costs a Redis or coordinator round trip. The routing gauges are set after every refresh attempt
//! (the background refresher runs one at a third of the lease, and retries with backoff while it fails) and on
//! every publish, from the routing the publish used (or, when it was refused, from the cache). They are
//! therefore "as of the last update". Before the first successful refresh the age shows 0 and the lease 0.
//! Counters are incremented where [`ProducerStats`](crate::ProducerStats) counters are.

use protocol::names::StreamName;
use std::time::Duration;

// One copy of the handles for both SDKs, chosen by this crate's own feature (see `client_core::metrics`).
use crate::routing_cache::CacheGauges;
#[cfg(feature = "metrics")]
use client_core::metrics::facade as handles;
#[cfg(not(feature = "metrics"))]
use client_core::metrics::noop as handles;
use handles::{Counter, Gauge};

/// The metric names of the producer. Every name starts with `redis_stream_producer_`.
pub mod names {
    /// Gauge, seconds: time since the cached routing was last returned or renewed by a refresh (its send time).
    pub const ROUTING_CACHE_AGE: &str = "redis_stream_producer_routing_cache_age_seconds";
    /// Gauge, seconds: time left on the routing lease (0: publishes fail closed).
    pub const ROUTING_LEASE_REMAINING: &str = "redis_stream_producer_routing_lease_remaining_seconds";
    /// Gauge: routing version of the cached routing.
    pub const ROUTING_VERSION: &str = "redis_stream_producer_routing_version";
    /// Counter: successful routing refreshes.
    pub const ROUTING_REFRESHES: &str = "redis_stream_producer_routing_refreshes_total";
    /// Counter: failed routing refreshes.
    pub const ROUTING_REFRESH_FAILURES: &str = "redis_stream_producer_routing_refresh_failures_total";
    /// Counter: `SYNC_METADATA` answers adopted that changed the routing in use (a rollback).
    pub const ROUTING_ROLLBACKS: &str = "redis_stream_producer_routing_rollbacks_total";
    /// Counter, label `reason`: publishes refused for lack of a valid routing.
    pub const PUBLISH_FAILURES: &str = "redis_stream_producer_publish_failures_total";
    /// Counter, label `outcome`: records by write outcome.
    pub const RECORDS: &str = "redis_stream_producer_records_total";
    /// Counter: failed writes of the highest observed routing version to the version store.
    pub const VERSION_STORE_FAILURES: &str = "redis_stream_producer_version_store_failures_total";
    /// Gauge: 1 while the highest observed routing version is not persisted after a failed write.
    pub const VERSION_UNPERSISTED: &str = "redis_stream_producer_version_unpersisted";

    /// Every name above.
    pub const ALL: [&str; 10] = [
        ROUTING_CACHE_AGE,
        ROUTING_LEASE_REMAINING,
        ROUTING_VERSION,
        ROUTING_REFRESHES,
        ROUTING_REFRESH_FAILURES,
        ROUTING_ROLLBACKS,
        PUBLISH_FAILURES,
        RECORDS,
        VERSION_STORE_FAILURES,
        VERSION_UNPERSISTED,
    ];
}

/// `reason` of a publish refused because the routing lease ended and no refresh succeeded since.
pub const REASON_ROUTING_EXPIRED: &str = "routing_expired";
/// `reason` of a publish refused because no routing was ever fetched.
pub const REASON_NO_ROUTING: &str = "no_routing";
/// `outcome` of records written to their shard.
pub const OUTCOME_WRITTEN: &str = "written";
/// `outcome` of records known not to be written.
pub const OUTCOME_NOT_WRITTEN: &str = "not_written";
/// `outcome` of records that may or may not be written (connection lost mid-pipeline), or that a durable producer
/// saw written on the master but not confirmed by enough replicas.
pub const OUTCOME_UNKNOWN: &str = "unknown";

/// The handles of one producer, registered once at build time (see the module docs). `Default` is a set of
/// handles that record nothing (for unit tests).
#[derive(Debug, Clone, Default)]
pub(crate) struct ProducerMetrics {
    cache_age: Gauge,
    lease_remaining: Gauge,
    version: Gauge,
    refreshes: Counter,
    refresh_failures: Counter,
    rollbacks: Counter,
    refused_expired: Counter,
    refused_never_fetched: Counter,
    written: Counter,
    not_written: Counter,
    unknown: Counter,
    store_failures: Counter,
    unpersisted: Gauge,
}

impl ProducerMetrics {
    /// Registers every series of `stream` with the recorder installed now.
    pub(crate) fn new(stream: &StreamName) -> Self {
        describe::describe();
        let stream = stream.to_string();
        let gauge = |name| handles::gauge(name, &[("stream", stream.clone())]);
        let counter = |name| handles::counter(name, &[("stream", stream.clone())]);
        let labelled = |name, key: &'static str, value: &str| {
            handles::counter(name, &[("stream", stream.clone()), (key, value.into())])
        };
        ProducerMetrics {
            cache_age: gauge(names::ROUTING_CACHE_AGE),
            lease_remaining: gauge(names::ROUTING_LEASE_REMAINING),
            version: gauge(names::ROUTING_VERSION),
            refreshes: counter(names::ROUTING_REFRESHES),
            refresh_failures: counter(names::ROUTING_REFRESH_FAILURES),
            rollbacks: counter(names::ROUTING_ROLLBACKS),
            refused_expired: labelled(names::PUBLISH_FAILURES, "reason", REASON_ROUTING_EXPIRED),
            refused_never_fetched: labelled(names::PUBLISH_FAILURES, "reason", REASON_NO_ROUTING),
            written: labelled(names::RECORDS, "outcome", OUTCOME_WRITTEN),
            not_written: labelled(names::RECORDS, "outcome", OUTCOME_NOT_WRITTEN),
            unknown: labelled(names::RECORDS, "outcome", OUTCOME_UNKNOWN),
            store_failures: counter(names::VERSION_STORE_FAILURES),
            unpersisted: gauge(names::VERSION_UNPERSISTED),
        }
    }

    /// Sets the routing gauges from the cache (after a refresh attempt, or a refused publish).
    pub(crate) fn cache(&self, g: CacheGauges) {
        self.cache_age.set(g.age.unwrap_or_default().as_secs_f64());
        self.lease_remaining.set(g.lease_remaining.as_secs_f64());
        if let Some(v) = g.version {
            // Versions stay far below 2^53: exact as f64.
            self.version.set(v.0 as f64);
        }
    }

    /// Sets the age and lease gauges from the routing a publish is about to use (no lock, no clock read).
    pub(crate) fn routing_used(&self, age: Duration, lease_remaining: Duration) {
        self.cache_age.set(age.as_secs_f64());
        self.lease_remaining.set(lease_remaining.as_secs_f64());
    }

    pub(crate) fn refreshed(&self) {
        self.refreshes.increment(1);
    }

    pub(crate) fn refresh_failed(&self) {
        self.refresh_failures.increment(1);
    }

    /// A version-store write failed (it is retried).
    pub(crate) fn version_store_failed(&self) {
        self.store_failures.increment(1);
        self.unpersisted.set(1.0);
    }

    /// The highest observed version is persisted.
    pub(crate) fn version_persisted(&self) {
        self.unpersisted.set(0.0);
    }

    pub(crate) fn rolled_back(&self) {
        self.rollbacks.increment(1);
    }

    /// A publish refused: the lease ended (`expired`), or no routing was ever fetched.
    pub(crate) fn refused(&self, expired: bool) {
        if expired {
            self.refused_expired.increment(1);
        } else {
            self.refused_never_fetched.increment(1);
        }
    }

    /// Record outcomes of one publish.
    pub(crate) fn records(&self, written: u64, not_written: u64, unknown: u64) {
        for (counter, n) in [
            (&self.written, written),
            (&self.not_written, not_written),
            (&self.unknown, unknown),
        ] {
            if n > 0 {
                counter.increment(n);
            }
        }
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
            names::ROUTING_CACHE_AGE,
            Unit::Seconds,
            "Time since the cached routing was last returned or renewed by a refresh, as of the last update."
        );
        describe_gauge!(
            names::ROUTING_LEASE_REMAINING,
            Unit::Seconds,
            "Time left on the routing lease as of the last update (0: publishes fail closed)."
        );
        describe_gauge!(names::ROUTING_VERSION, "Routing version of the cached routing.");
        describe_counter!(names::ROUTING_REFRESHES, "Successful routing refreshes.");
        describe_counter!(names::ROUTING_REFRESH_FAILURES, "Failed routing refreshes.");
        describe_counter!(
            names::ROUTING_ROLLBACKS,
            "SYNC_METADATA answers that changed the routing in use (a rollback adopted)."
        );
        describe_counter!(
            names::PUBLISH_FAILURES,
            "Publishes refused before writing: reason=routing_expired or no_routing."
        );
        describe_counter!(
            names::RECORDS,
            "Records by write outcome: written, not_written, unknown."
        );
        describe_counter!(
            names::VERSION_STORE_FAILURES,
            "Failed writes of the highest observed routing version to the version store (retried until one succeeds)."
        );
        describe_gauge!(
            names::VERSION_UNPERSISTED,
            "1 while the highest observed routing version is not persisted after a failed version-store write."
        );
    }
}

/// Nothing to describe when the feature is off.
#[cfg(not(feature = "metrics"))]
mod describe {
    pub(super) fn describe() {}
}

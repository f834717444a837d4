//! The routing refresher: fetches the stream's routing from the coordinator and applies it to the
//! [`RoutingCache`], in the background on the cache's schedule and on demand from the publish path.
//!
//! # Single flight
//! Every refresh, background or on demand, runs under one async lock (`flight`). A caller that waited for the
//! lock first re-asks the cache whether a refresh is still needed: when another caller's refresh just
//! succeeded (or just failed, and the backoff forbids another try), it returns without a request of its own.
//! So a thousand publishes that find the lease expired cause one coordinator request, not a thousand.
//!
//! # Version store
//! Before the first request the highest routing version this stream's producers have observed is loaded from
//! the [`VersionStore`] (key: the stream name); every request carries it, and every time it grows it is stored
//! again, so a restarted producer still tells the coordinator about a routing Redis may have lost.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use client_core::{CoordClient, VersionStore, VersionStoreError};
use protocol::names::StreamName;
use protocol::RoutingVersion;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::{PublishError, RefreshError};
use crate::routing_cache::{Applied, PublishRoute, RoutingCache, RoutingInfo, Unavailable};
use crate::stats::Stats;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`VersionStore`] is not object safe (it returns `impl Future`); this erases it so the producer is not
/// generic over its store.
trait ErasedVersionStore: Send + Sync {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<u64, VersionStoreError>>;
    fn store<'a>(&'a self, key: &'a str, version: u64) -> BoxFuture<'a, Result<(), VersionStoreError>>;
}

impl<S: VersionStore> ErasedVersionStore for S {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<u64, VersionStoreError>> {
        Box::pin(VersionStore::load(self, key))
    }

    fn store<'a>(&'a self, key: &'a str, version: u64) -> BoxFuture<'a, Result<(), VersionStoreError>> {
        Box::pin(VersionStore::store(self, key, version))
    }
}

/// A type-erased, shareable version store.
#[derive(Clone)]
pub(crate) struct SharedVersionStore(Arc<dyn ErasedVersionStore>);

impl SharedVersionStore {
    pub(crate) fn new(store: impl VersionStore) -> Self {
        SharedVersionStore(Arc::new(store))
    }
}

impl std::fmt::Debug for SharedVersionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedVersionStore")
    }
}

/// State only the refresh in flight touches.
#[derive(Debug, Default)]
struct Flight {
    /// Whether the version store was read (done once, before the first request).
    store_loaded: bool,
    /// The highest version written to the version store, to store only when it grows.
    persisted_max: u64,
}

/// Fetches routing and keeps the cache current.
pub(crate) struct Refresher {
    stream: StreamName,
    client: CoordClient,
    store: SharedVersionStore,
    /// The pure cache. A std mutex: it is held for a few field reads, never across an await.
    cache: Mutex<RoutingCache>,
    /// Serialises refreshes (single flight); a tokio mutex because it is held across the HTTP request.
    flight: tokio::sync::Mutex<Flight>,
    /// The last refresh failure, for the errors of refused publishes.
    last_error: Mutex<Option<Arc<RefreshError>>>,
    /// Wakes the background loop when a hint makes a refresh due earlier than it planned.
    wake: Notify,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for Refresher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refresher")
            .field("stream", &self.stream)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl Refresher {
    pub(crate) fn new(
        stream: StreamName,
        client: CoordClient,
        store: SharedVersionStore,
        cache: RoutingCache,
        stats: Arc<Stats>,
    ) -> Self {
        Refresher {
            stream,
            client,
            store,
            cache: Mutex::new(cache),
            flight: tokio::sync::Mutex::new(Flight::default()),
            last_error: Mutex::new(None),
            wake: Notify::new(),
            stats,
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, RoutingCache> {
        self.cache
            .lock()
            .expect("the routing cache lock is never held across a panic")
    }

    /// The routing usable now, if any.
    pub(crate) fn current(&self) -> Option<RoutingInfo> {
        self.cache().route(Instant::now()).ok()
    }

    /// The highest routing version observed.
    pub(crate) fn max_observed(&self) -> RoutingVersion {
        self.cache().max_observed()
    }

    /// Records that a newer routing version exists (seen by another channel); refreshes at once if it is newer
    /// than the one in use.
    pub(crate) fn hint_newer_version(&self, version: RoutingVersion) {
        if self.cache().hint_newer_version(version) {
            self.wake.notify_one();
        }
    }

    /// The routing a publish may use now, refreshing first (single flight) when the cache says so.
    ///
    /// # Errors
    /// [`PublishError::RoutingExpired`] / [`PublishError::NoRouting`]: fail closed, nothing may be written.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call drops its refresh (if it was the one running); the next caller starts over.
    pub(crate) async fn routing_for_publish(&self) -> Result<RoutingInfo, PublishError> {
        let decision = self.cache().for_publish(Instant::now());
        let refused = match decision {
            PublishRoute::Use(info) => return Ok(self.used(info)),
            PublishRoute::Refuse(why) => why,
            PublishRoute::RefreshFirst => {
                self.refresh_if(|c, now| matches!(c.for_publish(now), PublishRoute::RefreshFirst))
                    .await;
                match self.cache().route(Instant::now()) {
                    Ok(info) => return Ok(self.used(info)),
                    Err(why) => why,
                }
            }
        };
        self.stats.routing_refusals.fetch_add(1, Ordering::Relaxed);
        let m = &self.stats.metrics;
        m.refused(matches!(refused, Unavailable::Expired { .. }));
        m.cache(self.cache().gauges_at(Instant::now()));
        Err(self.unavailable(refused))
    }

    /// Updates the routing gauges from the routing a publish is about to use (cheap: no lock, no clock read).
    fn used(&self, info: RoutingInfo) -> RoutingInfo {
        self.stats.metrics.routing_used(info.age, info.lease_remaining);
        info
    }

    fn unavailable(&self, why: Unavailable) -> PublishError {
        let last_error = self
            .last_error
            .lock()
            .expect("the last-error lock is never held across a panic")
            .clone();
        match why {
            Unavailable::NeverFetched => PublishError::NoRouting {
                stream: self.stream.clone(),
                last_error,
            },
            Unavailable::Expired { expired_for, version } => PublishError::RoutingExpired {
                stream: self.stream.clone(),
                expired_for,
                version,
                last_error,
            },
        }
    }

    /// Runs one refresh if `needed` still says so once this caller holds the single-flight lock.
    ///
    /// # Cancel safety
    /// Cancel safe: the cache is only changed after the answer arrived, in one synchronous step.
    async fn refresh_if(&self, needed: impl Fn(&RoutingCache, Instant) -> bool) {
        let mut flight = self.flight.lock().await;
        if !needed(&self.cache(), Instant::now()) {
            return;
        }
        if let Err(e) = self.refresh_locked(&mut flight).await {
            tracing::debug!(stream = %self.stream, error = %e, "routing refresh failed");
            self.stats.refresh_failures.fetch_add(1, Ordering::Relaxed);
            self.stats.metrics.refresh_failed();
            self.cache().refresh_failed(Instant::now());
            *self
                .last_error
                .lock()
                .expect("the last-error lock is never held across a panic") = Some(Arc::new(e));
        }
        // After every attempt, failed or not: during an outage the background retries keep the age growing and
        // the lease going down in the gauges even when nothing is published.
        let gauges = self.cache().gauges_at(Instant::now());
        self.stats.metrics.cache(gauges);
    }

    async fn refresh_locked(&self, flight: &mut Flight) -> Result<(), RefreshError> {
        if !flight.store_loaded {
            let stored = self.store.0.load(self.stream.as_str()).await?;
            flight.persisted_max = stored;
            flight.store_loaded = true;
            self.cache().observe_max(RoutingVersion(stored));
        }
        let query = self.cache().query();
        // The lease starts here, before the request leaves: never later than the coordinator's own clock start.
        let sent_at = Instant::now();
        let resp = self.client.routing(&self.stream, query).await?;
        let applied = self.cache().apply(&resp, sent_at);
        self.record(applied);
        if let Applied::UnexpectedStatus(status) = applied {
            return Err(RefreshError::UnexpectedStatus(status));
        }
        let max = self.cache().max_observed().0;
        if max > flight.persisted_max {
            match self.store.0.store(self.stream.as_str(), max).await {
                Ok(()) => flight.persisted_max = max,
                Err(e) => {
                    // Not fatal: the routing is applied; the store is retried when the next answer arrives.
                    self.stats.version_store_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(stream = %self.stream, error = %e, "cannot persist the observed routing version");
                }
            }
        }
        Ok(())
    }

    fn record(&self, applied: Applied) {
        let s = &self.stats;
        if applied.is_success() {
            s.refreshes.fetch_add(1, Ordering::Relaxed);
            s.metrics.refreshed();
        }
        match applied {
            Applied::Replaced { from, to } => {
                s.routing_updates.fetch_add(1, Ordering::Relaxed);
                tracing::info!(stream = %self.stream, from = ?from, routing_version = %to, "routing updated");
            }
            Applied::Renewed => {}
            Applied::SyncAdopted { from, to } => {
                s.sync_metadata_responses.fetch_add(1, Ordering::Relaxed);
                if from != Some(to) {
                    s.routing_rollbacks.fetch_add(1, Ordering::Relaxed);
                    s.metrics.rolled_back();
                    tracing::warn!(stream = %self.stream, from = ?from, routing_version = %to,
                        "coordinator answered SYNC_METADATA: adopted the routing Redis stores (rollback)");
                }
            }
            Applied::IgnoredOlder { current, offered } => {
                s.ignored_older_responses.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(stream = %self.stream, routing_version = %current, offered = %offered,
                    "ignored an OK routing answer older than the routing in use");
            }
            Applied::UnexpectedStatus(_) => {}
        }
    }

    /// The background loop: refreshes when the cache says a refresh is due, until `cancel` fires.
    ///
    /// # Cancel safety
    /// Stops at the next await after `cancel` fires; a refresh in flight is dropped, which is harmless.
    pub(crate) async fn run(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            let next = self.cache().next_refresh_at(Instant::now());
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep_until(next.into()) => {}
                // A hint arrived: re-plan.
                _ = self.wake.notified() => continue,
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.refresh_if(|c, now| c.refresh_due(now)) => {}
            }
        }
    }
}

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
//! again, so a restarted producer still tells the coordinator about a routing Redis may have lost. The write is
//! retried until it succeeds ([`VersionPersister`]). The highest shard count observed is kept the same way under
//! the key `<stream>/#shards` (no stream or group name can form it): with jump hash a growth only adds shards, so
//! the count is what a coordinator needs to restore a growth Redis lost (issue 30). While a write fails, publishing goes on within the routing
//! lease, each failure is logged and counted (`version_store_failures` in the stats, and the metrics
//! `redis_stream_producer_version_store_failures_total` and `..._version_unpersisted`).
//!
//! # Stale routing
//! Besides the periodic refresh and the caller's hint ([`crate::Producer::observe_routing_version`]), the
//! publish path refreshes at once when another client sharing its version store (with the default store: any
//! client of the process) observed a newer routing version of the stream: another producer's refresh, or a
//! consumer's heartbeat answer (it carries the routing version). They meet in the store's [`ObservedVersion`]
//! of the stream, read with one atomic load per publish.
//!
//! # Waiting for the first routing
//! A producer that starts while its coordinator's Redis restarts, or while a coordinator instance terminates,
//! gets a retryable answer (`503 STORE_UNAVAILABLE`, `COORDINATOR_TERMINATING`, a refused connection): failing
//! [`crate::Producer::ready`] on it would make every start during a blip fail. So `ready`, and a publish that
//! finds no routing ever fetched, retry a retryable failure ([`RefreshError::is_retryable`]) on the cache's
//! backoff (Retry-After included) for up to `coordinator_timeout` from the call, holding the single-flight lock
//! so publishes queued behind still leave in order. A final answer (`401`, `404 NOT_FOUND`, `400`) fails at
//! once. Once a routing was held, an expired lease still fails a publish closed at once: only `ready` waits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use client_core::{
    CoordTransport, ObservedVersion, PersistObserver, SharedVersionStore, VersionPersister, VersionStoreError,
};
use protocol::names::StreamName;
use protocol::RoutingVersion;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::{PublishError, RefreshError};
use crate::routing_cache::{Applied, PublishRoute, RoutingCache, RoutingInfo, Unavailable};
use crate::stats::Stats;

/// Now, on Tokio's clock (so tests under paused time move it; equal to [`Instant::now`] otherwise). The routing
/// cache is pure and takes this as an argument.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// State only the refresh in flight touches.
#[derive(Debug, Default)]
struct Flight {
    /// Persists the highest observed version; started once the store was read (before the first request).
    persister: Option<VersionPersister>,
    /// Persists the highest observed shard count, likewise.
    counts: Option<VersionPersister>,
}

/// The version-store key of the highest shard count observed for `stream`: a '/' joins a stream and a group in
/// the consumers' keys, and no group name holds '#'.
fn shard_count_key(stream: &StreamName) -> String {
    format!("{stream}/#shards")
}

/// Turns the persister's reports into the producer's stats and metrics.
struct StoreObserver(Arc<Stats>);

impl PersistObserver for StoreObserver {
    fn failed(&self, _version: u64, _error: &VersionStoreError) {
        self.0.version_store_failures.fetch_add(1, Ordering::Relaxed);
        self.0.metrics.version_store_failed();
    }

    fn persisted(&self, _version: u64) {
        self.0.metrics.version_persisted();
    }
}

/// Fetches routing and keeps the cache current.
pub(crate) struct Refresher {
    stream: StreamName,
    /// The coordinator: the HTTP client in production, an in-memory fake in the tests.
    client: Arc<dyn CoordTransport>,
    store: SharedVersionStore,
    /// What every client of the process observed for this stream's routing.
    observed: ObservedVersion,
    /// The highest shard count every client of the process observed for this stream.
    observed_count: ObservedVersion,
    /// The value of `observed` already acted on (a refresh answered after it), so a version the coordinator did
    /// not confirm (a rollback) does not turn into a refresh per publish.
    observed_seen: AtomicU64,
    /// The pure cache. A std mutex: it is held for a few field reads, never across an await.
    cache: Mutex<RoutingCache>,
    /// Serialises refreshes (single flight); a tokio mutex because it is held across the HTTP request.
    flight: tokio::sync::Mutex<Flight>,
    /// Publishes waiting for a refresh (queued on `flight`). While any are, a new publish queues behind them even
    /// if the routing it finds is usable: the lock is FIFO, so publishes leave in the order they were issued (one
    /// issued after the refresh updated the cache must not overtake one still waiting to be woken by it).
    waiting: AtomicU64,
    /// The last refresh failure, for the errors of refused publishes.
    last_error: Mutex<Option<Arc<RefreshError>>>,
    /// Wakes the background loop when a hint makes a refresh due earlier than it planned.
    wake: Notify,
    /// How long `ready` and the first routing wait out retryable failures (the producer's `coordinator_timeout`).
    first_wait: Duration,
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

/// Counts a publish waiting for a refresh, also when its future is dropped on the way.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn enter(count: &'a AtomicU64) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Refresher {
    pub(crate) fn new(
        stream: StreamName,
        client: Arc<dyn CoordTransport>,
        store: SharedVersionStore,
        cache: RoutingCache,
        first_wait: Duration,
        stats: Arc<Stats>,
    ) -> Self {
        let observed = store.observed(stream.as_str());
        let observed_count = store.observed(&shard_count_key(&stream));
        Refresher {
            stream,
            client,
            store,
            observed,
            observed_count,
            observed_seen: AtomicU64::new(0),
            cache: Mutex::new(cache),
            flight: tokio::sync::Mutex::new(Flight::default()),
            waiting: AtomicU64::new(0),
            last_error: Mutex::new(None),
            wake: Notify::new(),
            first_wait,
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
        self.cache().route(now()).ok()
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

    /// The routing a publish may use now, refreshing first (single flight) when the cache says so. Before the
    /// first routing it waits out retryable failures (see "Waiting for the first routing" in the module docs).
    ///
    /// # Errors
    /// [`PublishError::RoutingExpired`] / [`PublishError::NoRouting`]: fail closed, nothing may be written.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call drops its refresh (if it was the one running); the next caller starts over.
    pub(crate) async fn routing_for_publish(&self) -> Result<RoutingInfo, PublishError> {
        let first = matches!(self.cache().route(now()), Err(Unavailable::NeverFetched));
        self.routing(first.then(|| now() + self.first_wait)).await
    }

    /// The routing `ready` returns: as [`Self::routing_for_publish`], and it waits out retryable failures
    /// whether or not a routing was held before.
    ///
    /// # Errors
    /// As [`Self::routing_for_publish`], once `coordinator_timeout` has passed or a failure is final.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Self::routing_for_publish`].
    pub(crate) async fn routing_for_ready(&self) -> Result<RoutingInfo, PublishError> {
        self.routing(Some(now() + self.first_wait)).await
    }

    /// The routing usable now; with `retry_until`, retryable refresh failures are retried until then.
    async fn routing(&self, retry_until: Option<Instant>) -> Result<RoutingInfo, PublishError> {
        self.check_process_version();
        let decision = match self.cache().for_publish(now()) {
            PublishRoute::Use(_) if self.waiting.load(Ordering::Acquire) > 0 => PublishRoute::RefreshFirst,
            // Within the backoff of a failure: a caller that waits, waits for its end.
            PublishRoute::Refuse(_) if retry_until.is_some() => PublishRoute::RefreshFirst,
            other => other,
        };
        let refused = match decision {
            PublishRoute::Use(info) => return Ok(self.used(info)),
            PublishRoute::Refuse(why) => why,
            PublishRoute::RefreshFirst => {
                let _waiting = Waiting::enter(&self.waiting);
                self.refresh_if(
                    |c, now| matches!(c.for_publish(now), PublishRoute::RefreshFirst),
                    retry_until,
                )
                .await;
                match self.cache().route(now()) {
                    Ok(info) => return Ok(self.used(info)),
                    Err(why) => why,
                }
            }
        };
        self.stats.routing_refusals.fetch_add(1, Ordering::Relaxed);
        let m = &self.stats.metrics;
        m.refused(matches!(refused, Unavailable::Expired { .. }));
        m.cache(self.cache().gauges_at(now()));
        Err(self.unavailable(refused))
    }

    /// Turns a newer routing version seen by another client of the process into a hint (at most once per value).
    fn check_process_version(&self) {
        let seen = self.observed.get();
        if seen > self.observed_seen.load(Ordering::Relaxed) {
            self.observed_seen.fetch_max(seen, Ordering::Relaxed);
            self.hint_newer_version(RoutingVersion(seen));
        }
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

    /// Runs one refresh if `needed` still says so once this caller holds the single-flight lock. With
    /// `retry_until`, while there is no usable routing and the last failure is retryable, it waits for the end of
    /// the backoff and refreshes again, as long as that next attempt starts before `retry_until`; an attempt
    /// still in flight then is dropped.
    ///
    /// # Cancel safety
    /// Cancel safe: the cache is only changed after the answer arrived, in one synchronous step.
    async fn refresh_if(&self, needed: impl Fn(&RoutingCache, Instant) -> bool, retry_until: Option<Instant>) {
        let mut flight = self.flight.lock().await;
        let mut retrying = false;
        loop {
            if !needed(&self.cache(), now()) {
                let Some(next) = retry_until.and_then(|until| self.next_retry(until)) else {
                    return;
                };
                tokio::time::sleep_until(next.into()).await;
                retrying = true;
                continue;
            }
            let result = match retry_until {
                // The first attempt is bounded by the HTTP client's own timeout; a retry by what is left.
                Some(until) if retrying => {
                    match tokio::time::timeout_at(until.into(), self.refresh_locked(&mut flight)).await {
                        Ok(result) => result,
                        Err(_) => return,
                    }
                }
                _ => self.refresh_locked(&mut flight).await,
            };
            if let Err(e) = result {
                self.refresh_failed(e);
            }
            // After every attempt, failed or not: during an outage the background retries keep the age growing
            // and the lease going down in the gauges even when nothing is published.
            let gauges = self.cache().gauges_at(now());
            self.stats.metrics.cache(gauges);
            if retry_until.is_none() {
                return;
            }
        }
    }

    /// When a waiting caller should refresh again: the end of the backoff, if there is no usable routing, the
    /// last failure is retryable and that end comes before `until`.
    fn next_retry(&self, until: Instant) -> Option<Instant> {
        let now = now();
        let cache = self.cache();
        if cache.route(now).is_ok() {
            return None;
        }
        let retryable = self
            .last_error
            .lock()
            .expect("the last-error lock is never held across a panic")
            .as_deref()
            .is_some_and(RefreshError::is_retryable);
        let next = cache.next_attempt_at(now);
        (retryable && next < until).then_some(next)
    }

    fn refresh_failed(&self, e: RefreshError) {
        tracing::debug!(stream = %self.stream, error = %e, "routing refresh failed");
        self.stats.refresh_failures.fetch_add(1, Ordering::Relaxed);
        self.stats.metrics.refresh_failed();
        // RATE_LIMITED: no request before the coordinator's Retry-After, whatever the retry policy allows.
        let retry_after = match &e {
            RefreshError::Coordinator(c) => c.retry_after().unwrap_or_default(),
            _ => Duration::ZERO,
        };
        self.cache().refresh_refused(now(), retry_after);
        *self
            .last_error
            .lock()
            .expect("the last-error lock is never held across a panic") = Some(Arc::new(e));
    }

    async fn refresh_locked(&self, flight: &mut Flight) -> Result<(), RefreshError> {
        if flight.persister.is_none() {
            let stored = self.store.load(self.stream.as_str()).await?;
            flight.persister = Some(VersionPersister::spawn(
                self.store.clone(),
                self.stream.as_str(),
                stored,
                client_core::PersistPolicy::default(),
                Arc::new(StoreObserver(self.stats.clone())),
            ));
            self.cache().observe_max(RoutingVersion(stored));
        }
        if flight.counts.is_none() {
            let key = shard_count_key(&self.stream);
            let stored = self.store.load(&key).await?;
            flight.counts = Some(VersionPersister::spawn(
                self.store.clone(),
                key,
                stored,
                client_core::PersistPolicy::default(),
                Arc::new(StoreObserver(self.stats.clone())),
            ));
            self.cache()
                .observe_max_shard_count(u32::try_from(stored).unwrap_or(u32::MAX));
        }
        let shared_count = self.observed_count.get();
        self.cache()
            .observe_max_shard_count(u32::try_from(shared_count).unwrap_or(u32::MAX));
        // What the other clients of the store observed is this process's observation too: report it.
        let shared_max = self.observed.get();
        self.cache().observe_max(RoutingVersion(shared_max));
        let query = self.cache().query();
        // The lease starts here, before the request leaves: never later than the coordinator's own clock start.
        let sent_at = now();
        let resp = self.client.routing(&self.stream, query).await?;
        let applied = self.cache().apply(&resp, sent_at);
        self.record(applied);
        if let Applied::UnexpectedStatus(status) = applied {
            return Err(RefreshError::UnexpectedStatus(status));
        }
        let max = self.cache().max_observed().0;
        // The coordinator answered a query that carried everything observed up to its send: that is acted on.
        self.observed.raise(max);
        self.observed_seen.fetch_max(shared_max.max(max), Ordering::Relaxed);
        if let Some(p) = &flight.persister {
            p.observe(max);
        }
        let count = u64::from(self.cache().max_shard_count());
        self.observed_count.raise(count);
        if let Some(p) = &flight.counts {
            p.observe(count);
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

    /// Waits, bounded, until the highest observed version is persisted, so the next process starts from what this
    /// one saw (a graceful close; a failing store must not hold it).
    pub(crate) async fn flush_versions(&self) {
        let flight = self.flight.lock().await;
        let timeout = client_core::PersistPolicy::default().attempt_timeout;
        if let Some(p) = &flight.persister {
            if !p.flush(timeout).await {
                tracing::warn!(stream = %self.stream, "closing with the highest observed routing version not persisted");
            }
        }
        if let Some(p) = &flight.counts {
            if !p.flush(timeout).await {
                tracing::warn!(stream = %self.stream, "closing with the highest observed shard count not persisted");
            }
        }
    }

    /// The background loop: refreshes when the cache says a refresh is due, until `cancel` fires.
    ///
    /// # Cancel safety
    /// Stops at the next await after `cancel` fires; a refresh in flight is dropped, which is harmless.
    pub(crate) async fn run(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            let next = self.cache().next_refresh_at(now());
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep_until(next.into()) => {}
                // A hint arrived: re-plan.
                _ = self.wake.notified() => continue,
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.refresh_if(|c, now| c.refresh_due(now), None) => {}
            }
        }
    }
}

/// The refresher's schedules under paused Tokio time, against an in-memory coordinator: exact instants, no
/// wall-clock sleeps.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing_cache::RetryPolicy;
    use client_core::testing::{FakeCoord, Reply};
    use client_core::MemoryVersionStore;
    use protocol::messages::RoutingResponse;
    use protocol::Status;

    const MS: Duration = Duration::from_millis(1);
    const RETRY: RetryPolicy = RetryPolicy {
        min: Duration::from_millis(50),
        max: Duration::from_millis(400),
    };

    /// How long the first routing waits out retryable failures in these tests.
    const FIRST_WAIT: Duration = Duration::from_millis(2000);

    fn answer(version: u64, lease_ms: u64, refresh_ms: u64) -> RoutingResponse {
        RoutingResponse {
            status: Status::Ok,
            stream: StreamName::new("orders").unwrap(),
            routing_version: RoutingVersion(version),
            shard_count: 4,
            routing_lease_ms: lease_ms,
            refresh_interval_ms: refresh_ms,
            shard_records: false,
        }
    }

    fn refresher(fake: &FakeCoord) -> Arc<Refresher> {
        let stream = StreamName::new("orders").unwrap();
        Arc::new(Refresher::new(
            stream.clone(),
            Arc::new(fake.clone()),
            SharedVersionStore::new(MemoryVersionStore::default()),
            RoutingCache::new(RETRY),
            FIRST_WAIT,
            Arc::new(Stats::new(&stream)),
        ))
    }

    /// Arrival times of the routing queries, relative to `t0`.
    fn query_times(fake: &FakeCoord, t0: tokio::time::Instant) -> Vec<Duration> {
        fake.routing_queries().iter().map(|(at, _)| *at - t0).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_lease_of_a_slow_answer_counts_from_the_send_time() {
        let fake = FakeCoord::new();
        fake.on_routing(|_| Reply::answer(answer(1, 2000, 600)).after(800 * MS));
        let r = refresher(&fake);
        let t0 = tokio::time::Instant::now();
        let info = r.routing_for_publish().await.unwrap();
        assert_eq!(t0.elapsed(), 800 * MS, "waited for the answer");
        assert_eq!(
            info.lease_remaining,
            1200 * MS,
            "2000 ms from the send, 800 ms of it spent waiting"
        );
        assert_eq!(info.age, 800 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn background_refreshes_follow_the_refresh_interval_from_each_send() {
        let fake = FakeCoord::new();
        // The answer takes 40 ms: the next refresh is planned from the send, not from the answer.
        fake.on_routing(|_| Reply::answer(answer(1, 1500, 300)).after(40 * MS));
        let r = refresher(&fake);
        let t0 = tokio::time::Instant::now();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(&r).run(cancel.clone()));
        tokio::time::sleep(1000 * MS).await;
        cancel.cancel();
        task.await.unwrap();
        assert_eq!(
            query_times(&fake, t0),
            vec![Duration::ZERO, 300 * MS, 600 * MS, 900 * MS]
        );
        assert_eq!(r.stats.refreshes.load(Ordering::Relaxed), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn the_refresh_interval_is_capped_at_half_the_lease() {
        let fake = FakeCoord::new();
        fake.on_routing(|_| Reply::answer(answer(1, 400, 60_000)));
        let r = refresher(&fake);
        let t0 = tokio::time::Instant::now();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(&r).run(cancel.clone()));
        tokio::time::sleep(500 * MS).await;
        cancel.cancel();
        task.await.unwrap();
        assert_eq!(query_times(&fake, t0), vec![Duration::ZERO, 200 * MS, 400 * MS]);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_refreshes_back_off_exponentially_and_the_routing_expires_at_its_lease_end() {
        let fake = FakeCoord::new();
        let mut n = 0;
        fake.on_routing(move |_| {
            n += 1;
            if n == 1 {
                Reply::answer(answer(1, 1000, 300))
            } else {
                Reply::unreachable()
            }
        });
        let r = refresher(&fake);
        let t0 = tokio::time::Instant::now();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(&r).run(cancel.clone()));
        tokio::time::sleep(999 * MS).await;
        assert!(r.current().is_some(), "usable until the lease end");
        tokio::time::sleep(MS).await;
        assert!(
            r.current().is_none(),
            "expired exactly 1000 ms after the send of the last success"
        );
        let err = r.routing_for_publish().await.unwrap_err();
        assert!(matches!(err, PublishError::RoutingExpired { .. }), "{err}");
        cancel.cancel();
        task.await.unwrap();
        // Due at 300 ms, then 50, 100, 200 after each failure; the next (400 ms, the cap) would be at 1050 ms, so
        // the publish at 1000 ms is refused without a request of its own.
        assert_eq!(query_times(&fake, t0), [0, 300, 350, 450, 650].map(|ms| ms * MS));
        assert_eq!(r.stats.refresh_failures.load(Ordering::Relaxed), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_publishes_share_one_refresh() {
        let fake = FakeCoord::new();
        fake.on_routing(|_| Reply::answer(answer(1, 60_000, 30_000)).after(500 * MS));
        let r = refresher(&fake);
        let publishes: Vec<_> = (0..50)
            .map(|_| {
                let r = Arc::clone(&r);
                tokio::spawn(async move { r.routing_for_publish().await })
            })
            .collect();
        for p in publishes {
            assert_eq!(p.await.unwrap().unwrap().version, RoutingVersion(1));
        }
        assert_eq!(
            fake.routing_queries().len(),
            1,
            "one request for 50 publishes (single flight)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_hint_of_a_newer_version_refreshes_at_once() {
        let fake = FakeCoord::new();
        let mut n = 0;
        fake.on_routing(move |_| {
            n += 1;
            Reply::answer(answer(n, 60_000, 30_000))
        });
        let r = refresher(&fake);
        let t0 = tokio::time::Instant::now();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(&r).run(cancel.clone()));
        tokio::time::sleep(100 * MS).await;
        r.hint_newer_version(RoutingVersion(2));
        tokio::time::sleep(100 * MS).await;
        cancel.cancel();
        task.await.unwrap();
        assert_eq!(query_times(&fake, t0), vec![Duration::ZERO, 100 * MS]);
        assert_eq!(r.current().map(|i| i.version), Some(RoutingVersion(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_routing_waits_out_retryable_failures_on_the_backoff() {
        let fake = FakeCoord::new();
        let mut n = 0;
        fake.on_routing(move |_| {
            n += 1;
            match n {
                1 => Reply::unreachable(),
                2 => Reply::refuse(Status::StoreUnavailable),
                _ => Reply::answer(answer(1, 60_000, 30_000)),
            }
        });
        let r = refresher(&fake);
        let t0 = tokio::time::Instant::now();
        let info = r.routing_for_publish().await.expect("waited out");
        assert_eq!(info.version, RoutingVersion(1));
        assert_eq!(query_times(&fake, t0), [0, 50, 150].map(|ms| ms * MS));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_routing_stops_waiting_when_the_next_attempt_falls_past_the_timeout() {
        let fake = FakeCoord::new();
        fake.on_routing(|_| Reply::refuse(Status::StoreUnavailable));
        let r = refresher(&fake);
        let t0 = tokio::time::Instant::now();
        let err = r.routing_for_publish().await.unwrap_err();
        assert!(
            matches!(
                err,
                PublishError::NoRouting {
                    last_error: Some(_),
                    ..
                }
            ),
            "{err}"
        );
        // 50, 100, 200, 400, 400, ... ms apart; the attempt after 1 950 ms would start at 2 350 ms, past 2 s.
        assert_eq!(
            query_times(&fake, t0),
            [0, 50, 150, 350, 750, 1150, 1550, 1950].map(|ms| ms * MS)
        );
        assert_eq!(t0.elapsed(), 1950 * MS);
        assert_eq!(
            r.stats.routing_refusals.load(Ordering::Relaxed),
            1,
            "one refusal, not one per try"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_final_answer_is_not_retried() {
        let fake = FakeCoord::new();
        fake.on_routing(|_| Reply::refuse(Status::NotFound));
        let r = refresher(&fake);
        let t0 = tokio::time::Instant::now();
        let err = r.routing_for_ready().await.unwrap_err();
        assert!(!err.is_retryable(), "{err}");
        assert_eq!(query_times(&fake, t0), [Duration::ZERO]);
    }

    #[tokio::test(start_paused = true)]
    async fn once_a_routing_expired_a_publish_fails_closed_at_once_but_ready_waits() {
        let fake = FakeCoord::new();
        let mut n = 0;
        fake.on_routing(move |_| {
            n += 1;
            match n {
                1 => Reply::answer(answer(1, 1000, 600)),
                2 | 3 => Reply::unreachable(),
                _ => Reply::answer(answer(1, 1000, 600)),
            }
        });
        let r = refresher(&fake);
        let t0 = tokio::time::Instant::now();
        r.routing_for_publish().await.unwrap();
        tokio::time::sleep(1000 * MS).await;
        let err = r.routing_for_publish().await.unwrap_err();
        assert!(matches!(err, PublishError::RoutingExpired { .. }), "{err}");
        assert_eq!(t0.elapsed(), 1000 * MS, "no wait");
        r.routing_for_ready().await.expect("ready waits out the outage");
        assert_eq!(query_times(&fake, t0), [0, 1000, 1050, 1150].map(|ms| ms * MS));
    }
}

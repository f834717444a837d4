//! The routing cache: what the producer knows about its stream's routing, and the rules that decide when to
//! refresh it, when to replace it and when publishing must stop.
//!
//! This module is pure: it never reads a clock, never sleeps and never does I/O. The caller passes the monotonic
//! `now`, and for an answer the monotonic *send* time of the request that returned it, which is where the lease
//! starts (the coordinator measured its lease from no later than that instant, so counting from the send time
//! never lets the producer use a routing longer than the coordinator granted).
//!
//! # Rules (each one has its own test below)
//! 1. The lease of an entry starts at the send time of the refresh that returned (or renewed) it and lasts the
//!    routing lease the coordinator gave (`routingLeaseMs`).
//! 2. A refresh is due at `lease start + refresh interval` (the coordinator suggests a third of the lease), even
//!    while publishes succeed.
//! 3. A newer routing version observed elsewhere (a stale-routing hint) makes a refresh due at once, and the
//!    publish path waits for it (single flight, in the refresher).
//! 4. An `OK` answer replaces the entry only with a newer routing version; the same version renews the lease; an
//!    older one is ignored and renews nothing.
//! 5. A `SYNC_METADATA` answer (the producer has observed a version above what Redis stores, i.e. a rollback) is
//!    adopted even though it is older, and is counted by the caller.
//! 6. A failed refresh keeps the entry while its lease is valid; after a failure the next attempt waits a short,
//!    growing backoff.
//! 7. Once the lease has ended, publishing is refused ([`Unavailable::Expired`]) until a refresh succeeds;
//!    nothing may be written to a shard without a valid routing.
//! 8. Every query carries the routing version in use and the highest version ever observed.

use std::time::{Duration, Instant};

use protocol::messages::{RoutingQuery, RoutingResponse};
use protocol::{RoutingVersion, Status};

/// Refresh intervals below this are raised to it (a coordinator bug must not turn into a refresh storm).
pub(crate) const MIN_REFRESH_INTERVAL: Duration = Duration::from_millis(10);

/// One routing the producer may publish with, and its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RoutingEntry {
    /// The routing version the coordinator answered.
    pub version: RoutingVersion,
    /// Number of shards at that version.
    pub shard_count: u32,
    /// Every shard of this routing has its record: fenced writes check that their shard exists at this routing.
    pub shard_records: bool,
    /// Send time of the refresh that returned or last renewed this entry: the lease starts here, not at the
    /// answer's arrival, so a slow answer shortens the lease instead of stretching it.
    pub lease_start: Instant,
    /// The routing lease the coordinator granted.
    pub lease: Duration,
    /// When to refresh after `lease_start`, clamped to `[MIN_REFRESH_INTERVAL, lease / 2]`.
    pub refresh_interval: Duration,
}

impl RoutingEntry {
    /// The first instant at which the entry may no longer be used.
    pub fn lease_end(&self) -> Instant {
        self.lease_start + self.lease
    }

    /// When the periodic refresh is due.
    pub fn refresh_at(&self) -> Instant {
        self.lease_start + self.refresh_interval
    }

    /// Whether the lease still holds at `now`.
    pub fn is_valid(&self, now: Instant) -> bool {
        now < self.lease_end()
    }
}

/// A routing the publish path may use right now.
///
/// ```
/// # async fn example(producer: &stream_producer::Producer) -> Result<(), stream_producer::PublishError> {
/// // Waits for the first routing (and checks Redis) before taking traffic.
/// let routing = producer.ready().await?;
/// println!("{} shards at routing version {}, lease {:?}", routing.shard_count, routing.version, routing.lease_remaining);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RoutingInfo {
    /// The routing version.
    pub version: RoutingVersion,
    /// Number of shards.
    pub shard_count: u32,
    /// Every shard of this routing has its record (see `crate::fence`).
    pub shard_records: bool,
    /// How long the lease still holds, measured at the time this value was taken.
    pub lease_remaining: Duration,
    /// Time since the send time of the refresh that last returned or renewed this routing (the cache age).
    pub age: Duration,
}

/// What the routing gauges show at one instant, valid lease or not (see `crate::metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CacheGauges {
    /// Time since the send time of the refresh that last returned or renewed the entry, even after its lease
    /// ended (an outage shows as an age that keeps growing). `None` before the first successful refresh.
    pub age: Option<Duration>,
    /// Time left on the lease; zero when it ended or no routing was ever fetched.
    pub lease_remaining: Duration,
    /// The version of the entry, valid or not.
    pub version: Option<RoutingVersion>,
}

/// Why the publish path has no routing to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unavailable {
    /// No refresh has ever succeeded.
    NeverFetched,
    /// The lease of the last routing ended this long ago and no refresh has succeeded since.
    Expired {
        /// Time since the lease ended.
        expired_for: Duration,
        /// The version whose lease ended.
        version: RoutingVersion,
    },
}

/// What the publish path should do before writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PublishRoute {
    /// Publish with this routing.
    Use(RoutingInfo),
    /// Refresh first (single flight), then ask [`RoutingCache::route`] again.
    RefreshFirst,
    /// Refuse: there is no valid routing and a refresh failed too recently to try again.
    Refuse(Unavailable),
}

/// What an answer did to the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// First routing, or a newer routing version replaced the entry.
    Replaced {
        /// The version used before, if any.
        from: Option<RoutingVersion>,
        /// The version now used.
        to: RoutingVersion,
    },
    /// Same version: the lease was renewed from the new send time.
    Renewed,
    /// `SYNC_METADATA`: the stored routing was adopted whatever its version.
    SyncAdopted {
        /// The version used before, if any.
        from: Option<RoutingVersion>,
        /// The version now used (may be lower: a rollback).
        to: RoutingVersion,
    },
    /// An `OK` answer with an older version than the one in use: ignored (no renewal).
    IgnoredOlder {
        /// The version in use.
        current: RoutingVersion,
        /// The version offered.
        offered: RoutingVersion,
    },
    /// An answer with a status a routing fetch never returns: treated as a failed refresh.
    UnexpectedStatus(Status),
}

impl Applied {
    /// Whether the answer counts as a successful refresh.
    pub fn is_success(&self) -> bool {
        !matches!(self, Applied::UnexpectedStatus(_))
    }
}

/// Backoff between failed refresh attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// Wait after the first failure.
    pub min: Duration,
    /// Upper bound of the doubling wait.
    pub max: Duration,
}

impl RetryPolicy {
    /// Wait after `failures` consecutive failures (`failures >= 1`).
    pub fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        self.min.saturating_mul(1 << doublings).min(self.max)
    }
}

/// The producer's view of its stream's routing.
#[derive(Debug, Clone)]
pub(crate) struct RoutingCache {
    entry: Option<RoutingEntry>,
    /// The highest routing version ever observed (answers, plus what the version store remembers).
    max_observed: RoutingVersion,
    /// The highest shard count ever observed: with `max_observed`, what the coordinator restores when Redis lost
    /// a growth this producer routed by.
    max_shard_count: u32,
    /// A newer routing version someone told us about: refresh at once.
    stale_hint: Option<RoutingVersion>,
    /// Consecutive failed refreshes.
    failures: u32,
    /// The coordinator's `Retry-After` of the last failure (zero when it gave none).
    retry_after: Duration,
    /// When the last failed refresh ended.
    last_failure_at: Option<Instant>,
    retry: RetryPolicy,
}

impl RoutingCache {
    /// An empty cache.
    pub fn new(retry: RetryPolicy) -> Self {
        RoutingCache {
            entry: None,
            max_observed: RoutingVersion(0),
            max_shard_count: 0,
            stale_hint: None,
            failures: 0,
            retry_after: Duration::ZERO,
            last_failure_at: None,
            retry,
        }
    }

    /// The entry, valid or not.
    #[cfg(test)]
    pub fn entry(&self) -> Option<&RoutingEntry> {
        self.entry.as_ref()
    }

    /// The highest routing version ever observed.
    pub fn max_observed(&self) -> RoutingVersion {
        self.max_observed
    }

    /// Consecutive failed refreshes.
    #[cfg(test)]
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Raises the highest observed version (e.g. from the version store at start). Never lowers it.
    pub fn observe_max(&mut self, version: RoutingVersion) {
        self.max_observed = self.max_observed.max(version);
    }

    /// The highest shard count ever observed.
    pub fn max_shard_count(&self) -> u32 {
        self.max_shard_count
    }

    /// Raises the highest observed shard count (e.g. from the version store at start). Never lowers it.
    pub fn observe_max_shard_count(&mut self, count: u32) {
        self.max_shard_count = self.max_shard_count.max(count);
    }

    /// Records a stale-routing hint: someone saw `version`. A refresh is due at once when it is newer than the
    /// version in use.
    pub fn hint_newer_version(&mut self, version: RoutingVersion) -> bool {
        let current = self.entry.map(|e| e.version).unwrap_or(RoutingVersion(0));
        if version > current {
            self.stale_hint = Some(self.stale_hint.map_or(version, |h| h.max(version)));
            true
        } else {
            false
        }
    }

    /// Whether a stale-routing hint is waiting for a refresh.
    pub fn is_stale(&self) -> bool {
        self.stale_hint.is_some()
    }

    /// The query of the next refresh: the version in use and the highest one ever observed.
    pub fn query(&self) -> RoutingQuery {
        RoutingQuery {
            routing_version: self.entry.map(|e| e.version).unwrap_or(RoutingVersion(0)),
            max_observed_version: self.max_observed,
            max_shard_count: self.max_shard_count,
        }
    }

    /// When the backoff after the last failure ends: the retry policy's wait, or the coordinator's
    /// `Retry-After` when that is longer. `None` without a failure.
    fn backoff_end(&self) -> Option<Instant> {
        match self.last_failure_at {
            Some(at) if self.failures > 0 => Some(at + self.retry.backoff(self.failures).max(self.retry_after)),
            _ => None,
        }
    }

    /// Whether a refresh attempt may start at `now` (no failure within the current backoff).
    pub fn may_attempt(&self, now: Instant) -> bool {
        self.backoff_end().is_none_or(|end| now >= end)
    }

    /// The first instant, seen from `now`, at which a refresh attempt may start (`now` when no backoff holds).
    pub fn next_attempt_at(&self, now: Instant) -> Instant {
        self.backoff_end().map_or(now, |end| end.max(now))
    }

    /// The routing to publish with at `now`, ignoring hints (used after a refresh attempt).
    pub fn route(&self, now: Instant) -> Result<RoutingInfo, Unavailable> {
        match self.entry {
            None => Err(Unavailable::NeverFetched),
            Some(e) if e.is_valid(now) => Ok(RoutingInfo {
                version: e.version,
                shard_count: e.shard_count,
                shard_records: e.shard_records,
                lease_remaining: e.lease_end() - now,
                age: now.saturating_duration_since(e.lease_start),
            }),
            Some(e) => Err(Unavailable::Expired {
                expired_for: now.saturating_duration_since(e.lease_end()),
                version: e.version,
            }),
        }
    }

    /// The values the routing gauges show at `now`.
    pub fn gauges_at(&self, now: Instant) -> CacheGauges {
        CacheGauges {
            age: self.entry.map(|e| now.saturating_duration_since(e.lease_start)),
            lease_remaining: self
                .entry
                .map_or(Duration::ZERO, |e| e.lease_end().saturating_duration_since(now)),
            version: self.entry.map(|e| e.version),
        }
    }

    /// What the publish path should do at `now`.
    pub fn for_publish(&self, now: Instant) -> PublishRoute {
        let may_attempt = self.may_attempt(now);
        match self.route(now) {
            Ok(_) if self.is_stale() && may_attempt => PublishRoute::RefreshFirst,
            Ok(info) => PublishRoute::Use(info),
            Err(_) if may_attempt => PublishRoute::RefreshFirst,
            Err(why) => PublishRoute::Refuse(why),
        }
    }

    /// When the background refresher should next refresh, seen from `now` (may be `<= now`: at once).
    pub fn next_refresh_at(&self, now: Instant) -> Instant {
        let backoff_end = self.backoff_end().unwrap_or(now);
        match self.entry {
            None => backoff_end,
            Some(_) if self.is_stale() => backoff_end,
            // After a failure the backoff decides (the attempt that failed was already due).
            Some(_) if self.failures > 0 => backoff_end,
            Some(e) => e.refresh_at(),
        }
    }

    /// Whether the background refresher should refresh at `now`.
    pub fn refresh_due(&self, now: Instant) -> bool {
        now >= self.next_refresh_at(now)
    }

    /// Applies an answer to a refresh sent at `sent_at`.
    pub fn apply(&mut self, resp: &RoutingResponse, sent_at: Instant) -> Applied {
        let fresh = RoutingEntry {
            version: resp.routing_version,
            shard_count: resp.shard_count,
            shard_records: resp.shard_records,
            lease_start: sent_at,
            lease: Duration::from_millis(resp.routing_lease_ms),
            refresh_interval: clamp_refresh(resp.refresh_interval_ms, resp.routing_lease_ms),
        };
        let from = self.entry.map(|e| e.version);
        let applied = match resp.status {
            Status::SyncMetadata => {
                self.entry = Some(fresh);
                Applied::SyncAdopted {
                    from,
                    to: fresh.version,
                }
            }
            Status::Ok => match self.entry {
                None => {
                    self.entry = Some(fresh);
                    Applied::Replaced {
                        from,
                        to: fresh.version,
                    }
                }
                Some(e) if fresh.version > e.version => {
                    self.entry = Some(fresh);
                    Applied::Replaced {
                        from,
                        to: fresh.version,
                    }
                }
                Some(e) if fresh.version == e.version => {
                    // Answers may arrive out of order: keep the later send time.
                    self.entry = Some(RoutingEntry {
                        lease_start: e.lease_start.max(sent_at),
                        ..fresh
                    });
                    Applied::Renewed
                }
                Some(e) => Applied::IgnoredOlder {
                    current: e.version,
                    offered: fresh.version,
                },
            },
            other => return Applied::UnexpectedStatus(other),
        };
        self.max_observed = self.max_observed.max(fresh.version);
        self.max_shard_count = self.max_shard_count.max(fresh.shard_count);
        self.failures = 0;
        self.last_failure_at = None;
        // The coordinator has answered after the hint: it is the authority. A hint it does not confirm (it answered
        // an older version) is dropped rather than turned into a refresh loop.
        self.stale_hint = None;
        applied
    }

    /// Records a failed refresh that ended at `now`, without a `Retry-After` (the refresher always passes the
    /// coordinator's, zero when it gave none, to [`RoutingCache::refresh_refused`]).
    #[cfg(test)]
    pub fn refresh_failed(&mut self, now: Instant) {
        self.refresh_refused(now, Duration::ZERO);
    }

    /// Records a failed refresh that ended at `now` with the coordinator's `Retry-After` (`RATE_LIMITED`): no
    /// attempt before it, whatever the retry policy allows.
    pub fn refresh_refused(&mut self, now: Instant, retry_after: Duration) {
        self.failures = self.failures.saturating_add(1);
        self.last_failure_at = Some(now);
        self.retry_after = retry_after;
    }
}

fn clamp_refresh(refresh_ms: u64, lease_ms: u64) -> Duration {
    let half_lease = Duration::from_millis(lease_ms / 2);
    Duration::from_millis(refresh_ms)
        .min(half_lease)
        .max(MIN_REFRESH_INTERVAL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::names::StreamName;

    const LEASE_MS: u64 = 1500;
    const RETRY: RetryPolicy = RetryPolicy {
        min: Duration::from_millis(50),
        max: Duration::from_millis(400),
    };

    fn resp(status: Status, version: u64, shards: u32) -> RoutingResponse {
        RoutingResponse {
            status,
            stream: StreamName::new("orders").unwrap(),
            routing_version: RoutingVersion(version),
            shard_count: shards,
            routing_lease_ms: LEASE_MS,
            refresh_interval_ms: LEASE_MS / 3,
            shard_records: false,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn cache_at_v1(t0: Instant) -> RoutingCache {
        let mut c = RoutingCache::new(RETRY);
        assert_eq!(
            c.apply(&resp(Status::Ok, 1, 4), t0),
            Applied::Replaced {
                from: None,
                to: RoutingVersion(1)
            }
        );
        c
    }

    #[test]
    fn lease_starts_at_the_send_time_not_the_answer_time() {
        let sent = Instant::now();
        let c = cache_at_v1(sent);
        // The answer arrived 600 ms after the send: 900 ms of lease are left, not 1500.
        let info = c.route(sent + ms(600)).unwrap();
        assert_eq!(info.lease_remaining, ms(900));
        assert_eq!(info.age, ms(600));
        assert_eq!(c.entry().unwrap().lease_end(), sent + ms(LEASE_MS));
        assert!(
            c.route(sent + ms(LEASE_MS)).is_err(),
            "the lease ends exactly at send + TTL"
        );
    }

    #[test]
    fn gauges_keep_the_age_growing_after_the_lease_ended() {
        let t0 = Instant::now();
        let mut c = RoutingCache::new(RETRY);
        assert_eq!(
            c.gauges_at(t0),
            CacheGauges {
                age: None,
                lease_remaining: Duration::ZERO,
                version: None
            }
        );
        c.apply(&resp(Status::Ok, 1, 4), t0);
        let g = c.gauges_at(t0 + ms(400));
        assert_eq!(
            (g.age, g.lease_remaining, g.version),
            (Some(ms(400)), ms(1100), Some(RoutingVersion(1)))
        );
        c.refresh_failed(t0 + ms(500));
        // Past the lease end: no routing to publish with, but the age still tells how old the last one is.
        let g = c.gauges_at(t0 + ms(LEASE_MS + 700));
        assert_eq!(g.age, Some(ms(LEASE_MS + 700)));
        assert_eq!(g.lease_remaining, Duration::ZERO);
        assert!(c.route(t0 + ms(LEASE_MS + 700)).is_err());
    }

    #[test]
    fn periodic_refresh_is_due_at_a_third_of_the_lease_even_while_publishing() {
        let t0 = Instant::now();
        let c = cache_at_v1(t0);
        assert_eq!(c.next_refresh_at(t0), t0 + ms(500));
        assert!(!c.refresh_due(t0 + ms(499)));
        assert!(c.refresh_due(t0 + ms(500)));
        // Publishing at that time still uses the cache: the refresh happens in the background.
        assert!(matches!(c.for_publish(t0 + ms(500)), PublishRoute::Use(_)));
    }

    #[test]
    fn refresh_interval_is_clamped_below_half_the_lease() {
        let t0 = Instant::now();
        let mut c = RoutingCache::new(RETRY);
        let mut r = resp(Status::Ok, 1, 4);
        r.refresh_interval_ms = 10_000;
        c.apply(&r, t0);
        assert_eq!(c.entry().unwrap().refresh_interval, ms(750));
        r.routing_version = RoutingVersion(2);
        r.refresh_interval_ms = 0;
        c.apply(&r, t0);
        assert_eq!(c.entry().unwrap().refresh_interval, MIN_REFRESH_INTERVAL);
    }

    #[test]
    fn empty_cache_refreshes_at_once_and_refuses_after_a_failure() {
        let t0 = Instant::now();
        let mut c = RoutingCache::new(RETRY);
        assert_eq!(c.for_publish(t0), PublishRoute::RefreshFirst);
        assert!(c.refresh_due(t0));
        c.refresh_failed(t0);
        assert_eq!(
            c.for_publish(t0 + ms(10)),
            PublishRoute::Refuse(Unavailable::NeverFetched)
        );
        assert_eq!(c.next_refresh_at(t0 + ms(10)), t0 + ms(50));
        assert_eq!(c.for_publish(t0 + ms(50)), PublishRoute::RefreshFirst);
    }

    #[test]
    fn stale_hint_refreshes_immediately_and_the_publish_waits_for_it() {
        let t0 = Instant::now();
        let mut c = cache_at_v1(t0);
        assert!(!c.hint_newer_version(RoutingVersion(1)), "the same version is no news");
        assert!(c.hint_newer_version(RoutingVersion(2)));
        let now = t0 + ms(10);
        assert_eq!(
            c.next_refresh_at(now),
            now,
            "refresh at once, not at the periodic point"
        );
        assert_eq!(c.for_publish(now), PublishRoute::RefreshFirst);
        c.apply(&resp(Status::Ok, 2, 6), now);
        assert!(!c.is_stale());
        assert!(matches!(
            c.for_publish(now),
            PublishRoute::Use(RoutingInfo { shard_count: 6, .. })
        ));
    }

    #[test]
    fn stale_hint_with_a_failing_refresh_keeps_publishing_on_the_valid_cache() {
        let t0 = Instant::now();
        let mut c = cache_at_v1(t0);
        c.hint_newer_version(RoutingVersion(2));
        c.refresh_failed(t0 + ms(10));
        // Within the backoff the hint does not block publishing: the lease still holds.
        assert!(matches!(c.for_publish(t0 + ms(20)), PublishRoute::Use(_)));
        // After the backoff the publish path tries again.
        assert_eq!(c.for_publish(t0 + ms(60)), PublishRoute::RefreshFirst);
    }

    #[test]
    fn stale_hint_is_settled_by_an_answer_that_does_not_confirm_it() {
        let t0 = Instant::now();
        let mut c = cache_at_v1(t0);
        c.hint_newer_version(RoutingVersion(7));
        assert_eq!(c.apply(&resp(Status::Ok, 1, 4), t0 + ms(5)), Applied::Renewed);
        assert!(!c.is_stale(), "the coordinator is the authority: no refresh loop");
    }

    #[test]
    fn newer_version_replaces_the_cache() {
        let t0 = Instant::now();
        let mut c = cache_at_v1(t0);
        let applied = c.apply(&resp(Status::Ok, 2, 6), t0 + ms(100));
        assert_eq!(
            applied,
            Applied::Replaced {
                from: Some(RoutingVersion(1)),
                to: RoutingVersion(2)
            }
        );
        assert_eq!(c.entry().unwrap().shard_count, 6);
        assert_eq!(c.entry().unwrap().lease_start, t0 + ms(100));
        assert_eq!(c.max_observed(), RoutingVersion(2));
    }

    #[test]
    fn same_version_renews_the_lease_from_the_new_send_time() {
        let t0 = Instant::now();
        let mut c = cache_at_v1(t0);
        assert_eq!(c.apply(&resp(Status::Ok, 1, 4), t0 + ms(500)), Applied::Renewed);
        assert_eq!(c.entry().unwrap().lease_end(), t0 + ms(500 + LEASE_MS));
        // A late answer to an earlier request does not move the lease back.
        assert_eq!(c.apply(&resp(Status::Ok, 1, 4), t0 + ms(200)), Applied::Renewed);
        assert_eq!(c.entry().unwrap().lease_end(), t0 + ms(500 + LEASE_MS));
    }

    #[test]
    fn older_ok_answer_is_ignored_and_renews_nothing() {
        let t0 = Instant::now();
        let mut c = cache_at_v1(t0);
        c.apply(&resp(Status::Ok, 3, 8), t0);
        let applied = c.apply(&resp(Status::Ok, 2, 6), t0 + ms(500));
        assert_eq!(
            applied,
            Applied::IgnoredOlder {
                current: RoutingVersion(3),
                offered: RoutingVersion(2)
            }
        );
        let e = c.entry().unwrap();
        assert_eq!((e.version, e.shard_count, e.lease_start), (RoutingVersion(3), 8, t0));
    }

    #[test]
    fn sync_metadata_adopts_the_older_stored_routing() {
        let t0 = Instant::now();
        let mut c = cache_at_v1(t0);
        c.apply(&resp(Status::Ok, 2, 6), t0);
        assert_eq!(
            c.query(),
            RoutingQuery {
                routing_version: RoutingVersion(2),
                max_observed_version: RoutingVersion(2),
                max_shard_count: 6,
            }
        );
        // Redis rolled back to version 1.
        let applied = c.apply(&resp(Status::SyncMetadata, 1, 4), t0 + ms(300));
        assert_eq!(
            applied,
            Applied::SyncAdopted {
                from: Some(RoutingVersion(2)),
                to: RoutingVersion(1)
            }
        );
        let e = c.entry().unwrap();
        assert_eq!(
            (e.version, e.shard_count, e.lease_start),
            (RoutingVersion(1), 4, t0 + ms(300))
        );
        // The highest observed version and shard count stay: the next query still tells the coordinator about them.
        assert_eq!(
            c.query(),
            RoutingQuery {
                routing_version: RoutingVersion(1),
                max_observed_version: RoutingVersion(2),
                max_shard_count: 6,
            }
        );
    }

    #[test]
    fn a_refusal_with_retry_after_waits_longer_than_the_retry_policy() {
        let t0 = Instant::now();
        let mut c = RoutingCache::new(RETRY);
        c.refresh_refused(t0, ms(700));
        assert!(!c.may_attempt(t0 + ms(699)), "the policy alone allows 50 ms");
        assert_eq!(c.next_refresh_at(t0 + ms(10)), t0 + ms(700));
        assert!(c.may_attempt(t0 + ms(700)));
        // A shorter Retry-After than the policy's backoff does not shorten it.
        c.refresh_refused(t0 + ms(700), ms(1));
        assert_eq!(c.next_refresh_at(t0 + ms(700)), t0 + ms(800));
    }

    #[test]
    fn failed_refresh_keeps_the_cache_while_the_lease_is_valid() {
        let t0 = Instant::now();
        let mut c = cache_at_v1(t0);
        c.refresh_failed(t0 + ms(500));
        c.refresh_failed(t0 + ms(560));
        let info = c.route(t0 + ms(1499)).expect("lease still valid");
        assert_eq!((info.version, info.shard_count), (RoutingVersion(1), 4));
        assert!(matches!(c.for_publish(t0 + ms(1499)), PublishRoute::Use(_)));
        assert_eq!(c.failures(), 2);
    }

    #[test]
    fn failed_refresh_retries_with_a_growing_backoff() {
        let t0 = Instant::now();
        let mut c = cache_at_v1(t0);
        c.refresh_failed(t0 + ms(500));
        assert_eq!(c.next_refresh_at(t0 + ms(500)), t0 + ms(550));
        c.refresh_failed(t0 + ms(550));
        assert_eq!(c.next_refresh_at(t0 + ms(550)), t0 + ms(650));
        for i in 0..10 {
            c.refresh_failed(t0 + ms(650 + i));
        }
        assert_eq!(
            c.next_refresh_at(t0 + ms(659)),
            t0 + ms(659 + 400),
            "capped at the max backoff"
        );
        // A success resets the backoff.
        c.apply(&resp(Status::Ok, 1, 4), t0 + ms(700));
        assert_eq!(c.failures(), 0);
        assert_eq!(c.next_refresh_at(t0 + ms(700)), t0 + ms(1200));
    }

    #[test]
    fn expired_lease_with_failing_refresh_refuses_every_publish() {
        let t0 = Instant::now();
        let mut c = cache_at_v1(t0);
        let end = t0 + ms(LEASE_MS);
        // At the end of the lease the publish path first tries a refresh...
        assert_eq!(c.for_publish(end), PublishRoute::RefreshFirst);
        c.refresh_failed(end);
        // ...which failed: refuse, without hammering the coordinator, until the backoff allows another try.
        assert_eq!(
            c.for_publish(end + ms(20)),
            PublishRoute::Refuse(Unavailable::Expired {
                expired_for: ms(20),
                version: RoutingVersion(1)
            })
        );
        assert!(c.route(end + ms(20)).is_err());
        assert_eq!(c.for_publish(end + ms(50)), PublishRoute::RefreshFirst);
        c.refresh_failed(end + ms(50));
        assert!(matches!(
            c.for_publish(end + ms(60)),
            PublishRoute::Refuse(Unavailable::Expired { .. })
        ));
    }

    #[test]
    fn expired_cache_recovers_on_the_next_successful_refresh() {
        let t0 = Instant::now();
        let mut c = cache_at_v1(t0);
        let later = t0 + ms(5000);
        c.refresh_failed(later);
        assert!(c.route(later).is_err());
        assert_eq!(c.apply(&resp(Status::Ok, 1, 4), later + ms(100)), Applied::Renewed);
        assert!(matches!(c.for_publish(later + ms(100)), PublishRoute::Use(_)));
    }

    #[test]
    fn query_carries_current_and_highest_observed_versions() {
        let t0 = Instant::now();
        let mut c = RoutingCache::new(RETRY);
        assert_eq!(c.query(), RoutingQuery::default());
        c.observe_max(RoutingVersion(9)); // remembered by the version store
        assert_eq!(
            c.query(),
            RoutingQuery {
                routing_version: RoutingVersion(0),
                max_observed_version: RoutingVersion(9),
                max_shard_count: 0,
            }
        );
        c.apply(&resp(Status::SyncMetadata, 4, 4), t0);
        c.observe_max(RoutingVersion(3));
        assert_eq!(
            c.query(),
            RoutingQuery {
                routing_version: RoutingVersion(4),
                max_observed_version: RoutingVersion(9),
                max_shard_count: 4,
            }
        );
    }

    #[test]
    fn unexpected_status_is_a_failure_and_changes_nothing() {
        let t0 = Instant::now();
        let mut c = cache_at_v1(t0);
        let applied = c.apply(&resp(Status::RevokePending, 5, 9), t0 + ms(10));
        assert_eq!(applied, Applied::UnexpectedStatus(Status::RevokePending));
        assert!(!applied.is_success());
        assert_eq!(c.entry().unwrap().version, RoutingVersion(1));
        assert_eq!(c.max_observed(), RoutingVersion(1));
    }
}

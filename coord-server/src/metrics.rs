//! Prometheus metrics of one coordinator: every signal the failure-handling design asks for, rendered by
//! `GET /metrics` in the Prometheus text format. The operator's view of them is `docs/metrics.md`; the alert rules
//! are in `deploy/prometheus/alerts.yaml`.
//!
//! # One recorder per coordinator, no global state
//! Each `Coordinator` owns a `PrometheusRecorder` built with `PrometheusBuilder::build_recorder()` (inside its
//! counters) and records into it through `metrics::with_local_recorder`, never through the
//! process-global recorder. Several coordinators in one process (the tests, the demo, an application that embeds a
//! coordinator and installs its own global recorder) therefore keep separate series, and nothing is installed
//! behind the embedding application's back.
//!
//! Where a counter already exists as an atomic of the coordinator's counters, the atomic stays the source of
//! truth: it is copied into the recorder (`Counter::absolute`) when `/metrics` is rendered, so a critical section
//! pays one relaxed atomic add per signal and nothing more. Labelled signals (heartbeat answers by status, events by
//! group) and the mutex latency histogram are recorded directly.
//!
//! The one process-wide value is [`startup_compatibility_failures`]: a start-up refused because Redis lacks a
//! command has no coordinator to count it in (and the binary exits at once, as the seeds require: fail fast), so it
//! is a process-wide counter, rendered by every coordinator of the process with `phase="startup"`.
//!
//! # Cardinality
//! * No label carries a member id, a shard id outside the lag family, or a revision.
//! * Per group (`stream`, `group`): about 10 gauges set by the tick and about 5 counters (+ one series per event
//!   kind seen).
//! * Per shard lag (`stream`, `group`, `shard`): 2 series per (shard, indexed group reading the stream), plus one
//!   length series per shard. 100 groups on streams of 64 shards make 12,800 lag series: drop the family with a
//!   `metric_relabel_configs` rule when that is too many. Shards above [`LAG_MAX_SHARDS_PER_STREAM`] are not
//!   exported.
//! * Gauges that are not refreshed for [`GAUGE_IDLE_TIMEOUT`] disappear (a deleted group, a removed shard).
//!
//! Every coordinator replica runs the tick loop and reads the same Redis, so the per-group gauges and the lag are
//! reported by every replica: aggregate them with `max by (stream, group)` rather than `sum`.

use metrics::{counter, gauge, histogram, with_local_recorder};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use metrics_util::MetricKindMask;
use protocol::metadata::GroupMetadata;
use protocol::names::{GroupName, StreamName};
use protocol::Status;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex as StdMutex;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::clock::LastRun;
use crate::error::{Error, StoreError};
use crate::state_machine::{Event, Liveness};
use crate::store::{lag, Store};

mod describe;
pub mod names;
pub mod tenants;

/// Gauges not refreshed for this long are dropped from `/metrics` (deleted groups, removed shards).
pub const GAUGE_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// A lag scrape younger than this is served again instead of asking Redis (several scrapers, scrape storms).
pub const LAG_MIN_REFRESH: Duration = Duration::from_secs(1);
/// A lag scrape that takes longer is abandoned; the previous values are served and the failure counted.
pub const LAG_SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// Shards of one stream beyond this many are left out of the lag family (cardinality guard).
pub const LAG_MAX_SHARDS_PER_STREAM: u32 = lag::MAX_SHARDS_PER_STREAM;
/// The `key` label values of [`names::DAMAGED_KEYS`].
pub const DAMAGED_KEY_LABELS: &[&str] = &["due_index", "groups_index", "routing"];
/// The `damage` label values of [`names::DAMAGED_KEYS`].
pub const DAMAGE_LABELS: &[&str] = &["wrong_type", "garbage", "lost"];
/// The `key` label values of [`names::DAMAGED_KEY_REPAIRS`]: the keys the coordinator can rebuild.
pub const REPAIRABLE_KEY_LABELS: &[&str] = &["due_index", "groups_index"];
/// Buckets of [`names::RESHARD_CHILDREN_WAIT`], in seconds: a drain takes from one tick to as long as consumers
/// lag.
const RESHARD_WAIT_BUCKETS: &[f64] = &[0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0];
/// Buckets of [`names::MUTEX_WAIT`] and [`names::HEARTBEAT_DURATION`]: from an uncontended round trip to the
/// critical-section deadline.
const MUTEX_WAIT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Start-ups refused because Redis is too old or lacks a command, in this process (see the module docs).
static STARTUP_COMPATIBILITY_FAILURES: AtomicU64 = AtomicU64::new(0);

/// How many coordinator start-ups in this process were refused because Redis is too old or lacks (or renamed) a
/// required command. Process-wide: a refused start-up has no coordinator instance to count it in.
pub fn startup_compatibility_failures() -> u64 {
    STARTUP_COMPATIBILITY_FAILURES.load(Ordering::Relaxed)
}

/// Counts a start-up check failure when it is a compatibility failure (not, say, a connection error).
pub(crate) fn count_startup_failure(e: &StoreError) {
    if is_compatibility_failure(e) {
        STARTUP_COMPATIBILITY_FAILURES.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether a store error says that Redis does not offer what the coordinator needs: a missing or renamed command,
/// a version too old, or an ACL that refuses a command or key (`NOPERM`).
pub fn is_compatibility_failure(e: &StoreError) -> bool {
    match e {
        StoreError::Unsupported(_) => true,
        StoreError::Node { source, .. } => is_compatibility_failure(source),
        StoreError::Redis(e) => {
            let text = e.to_string();
            e.code() == Some("NOPERM") || text.contains("NOPERM") || text.contains("unknown command")
        }
        _ => false,
    }
}

/// The atomic counters of one coordinator at one moment (see the module docs), copied into the recorder when
/// `/metrics` is rendered.
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    /// Mutex tries that found it held.
    pub mutex_busy: u64,
    /// Sections that ran a batch of heartbeats.
    pub heartbeat_batches: u64,
    /// Heartbeats run in those sections.
    pub heartbeats_batched: u64,
    /// Sections that gave up on a busy mutex.
    pub mutex_timeouts: u64,
    /// Lost compare-and-sets.
    pub revision_conflicts: u64,
    /// Suspected lost writes.
    pub metadata_regressions: u64,
    /// Producers that reported a routing version above the stored one.
    pub routing_regressions: u64,
    /// Requests answered `METADATA_UNAVAILABLE`.
    pub metadata_unavailable: u64,
    /// Redis restarts noticed.
    pub redis_restarts: u64,
    /// Groups the tick loop visited because they were due.
    pub tick_visits_due: u64,
    /// Groups the tick loop visited for the safety sweep.
    pub tick_visits_sweep: u64,
}

/// The recorder of one coordinator and the state of the lazy lag scrape.
pub struct Metrics {
    /// Where everything is recorded; private to this coordinator.
    recorder: PrometheusRecorder,
    /// Renders the recorder.
    handle: PrometheusHandle,
    /// Groups whose counters were already registered at zero (so a series exists before its first event).
    seen_groups: StdMutex<HashSet<(String, String)>>,
    /// When the lag was last scraped; the async lock also makes concurrent scrapes wait for one refresh.
    lag_scraped: tokio::sync::Mutex<LastRun>,
    /// The last `maxmemory-policy` check: 0 not yet, 1 safe, 2 unsafe (set again at every render, so the gauge
    /// never idles out while the condition lasts).
    eviction_policy: AtomicU8,
    /// The last usage scrape (per-tenant and Redis memory gauges); the async lock shares one scrape.
    usage: tokio::sync::Mutex<tenants::UsageCache>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh recorder with the coordinator's buckets and idle timeout, every fixed series registered at zero.
    pub fn new() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(names::MUTEX_WAIT.to_owned()), MUTEX_WAIT_BUCKETS)
            .expect("the bucket list is not empty")
            .set_buckets_for_metric(Matcher::Full(names::HEARTBEAT_DURATION.to_owned()), MUTEX_WAIT_BUCKETS)
            .expect("the bucket list is not empty")
            .set_buckets_for_metric(
                Matcher::Full(names::RESHARD_CHILDREN_WAIT.to_owned()),
                RESHARD_WAIT_BUCKETS,
            )
            .expect("the bucket list is not empty")
            .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE_TIMEOUT))
            .build_recorder();
        let handle = recorder.handle();
        let metrics = Metrics {
            recorder,
            handle,
            seen_groups: StdMutex::new(HashSet::new()),
            lag_scraped: tokio::sync::Mutex::new(LastRun::default()),
            eviction_policy: AtomicU8::new(0),
            usage: tokio::sync::Mutex::default(),
        };
        metrics.describe();
        metrics.record(|| {
            for status in Status::ALL {
                counter!(names::HEARTBEATS, "status" => status.as_str()).increment(0);
            }
            for kind in ["schema", "layout", "decode"] {
                counter!(names::METADATA_SCHEMA_ERRORS, "kind" => kind).increment(0);
            }
            counter!(names::COMPATIBILITY_FAILURES, "phase" => "runtime").increment(0);
            for key in DAMAGED_KEY_LABELS {
                for damage in DAMAGE_LABELS {
                    counter!(names::DAMAGED_KEYS, "key" => *key, "damage" => *damage).increment(0);
                }
            }
            for key in REPAIRABLE_KEY_LABELS {
                counter!(names::DAMAGED_KEY_REPAIRS, "key" => *key).increment(0);
            }
            counter!(names::ADMIN_REVISION_CONFLICTS).increment(0);
            counter!(names::LAG_SCRAPE_ERRORS).increment(0);
            counter!(names::USAGE_SCRAPE_ERRORS).increment(0);
        });
        metrics
    }

    /// Runs `f` with this coordinator's recorder as the recorder of the `metrics` macros.
    fn record<T>(&self, f: impl FnOnce() -> T) -> T {
        with_local_recorder(&self.recorder, f)
    }

    /// Records the result of a `maxmemory-policy` check.
    pub(crate) fn eviction_policy(&self, unsafe_policy: bool) {
        self.eviction_policy
            .store(if unsafe_policy { 2 } else { 1 }, Ordering::Relaxed);
        self.record(|| gauge!(names::EVICTION_POLICY_UNSAFE).set(if unsafe_policy { 1.0 } else { 0.0 }));
    }

    /// Records one heartbeat answer and how long it took.
    pub(crate) fn heartbeat_answered(&self, status: Status, took: Duration) {
        self.record(|| {
            counter!(names::HEARTBEATS, "status" => status.as_str()).increment(1);
            histogram!(names::HEARTBEAT_DURATION).record(took.as_secs_f64());
        });
    }

    /// Records a request refused because a token reached `quota` (`groups`, `shards`, `members`, `rate`).
    pub(crate) fn quota_refused(&self, quota: &'static str) {
        self.record(|| counter!(names::QUOTA_REFUSALS, "quota" => quota).increment(1));
    }

    /// Records the wait for a mutex.
    pub(crate) fn mutex_wait(&self, waited: Duration) {
        self.record(|| histogram!(names::MUTEX_WAIT).record(waited.as_secs_f64()));
    }

    /// Records a restoration of a stream's routing, once per reason.
    pub(crate) fn routing_restored(&self, why: &[crate::state_machine::routing::Why]) {
        self.record(|| {
            for w in why {
                counter!(names::ROUTING_RESTORED, "why" => w.as_str()).increment(1);
            }
        });
    }

    /// Records a restoration refused for a plan above the stream's growth ceiling.
    pub(crate) fn routing_restore_refused(&self) {
        self.record(|| counter!(names::ROUTING_RESTORE_REFUSED).increment(1));
    }

    /// Sets how many shards a stream's records show beyond its routing.
    pub(crate) fn shards_beyond_routing(&self, stream: &StreamName, n: u32) {
        let s = stream.to_string();
        self.record(|| gauge!(names::SHARDS_BEYOND_ROUTING, "stream" => s).set(f64::from(n)));
    }

    /// Records `n` findings of `damage` (one of [`DAMAGE_LABELS`]) in a coordinator key (one of
    /// [`DAMAGED_KEY_LABELS`]).
    pub(crate) fn damaged_key(&self, key: &'static str, damage: &'static str, n: u64) {
        self.record(|| counter!(names::DAMAGED_KEYS, "key" => key, "damage" => damage).increment(n));
    }

    /// Records the repair of a damaged index (one of [`REPAIRABLE_KEY_LABELS`]).
    pub(crate) fn damaged_key_repaired(&self, key: &'static str) {
        self.record(|| counter!(names::DAMAGED_KEY_REPAIRS, "key" => key).increment(1));
    }

    /// Records a refused admin `If-Match`.
    pub(crate) fn admin_revision_conflict(&self) {
        self.record(|| counter!(names::ADMIN_REVISION_CONFLICTS).increment(1));
    }

    /// Records an error of a request or a tick, when it is a compatibility failure.
    pub(crate) fn error(&self, e: &Error) {
        if let Error::Store(s) = e {
            if is_compatibility_failure(s) {
                self.record(|| counter!(names::COMPATIBILITY_FAILURES, "phase" => "runtime").increment(1));
            }
        }
    }

    /// Records why metadata was unreadable, from the sentence the store's decoders produce.
    pub(crate) fn metadata_unreadable(&self, message: &str) {
        let kind = if message.contains("layoutVersion") {
            "layout"
        } else if message.contains("schemaVersion") {
            "schema"
        } else if message.contains("unreadable") {
            "decode"
        } else {
            // Missing metadata: counted by `metadata_unavailable` alone.
            return;
        };
        self.record(|| counter!(names::METADATA_SCHEMA_ERRORS, "kind" => kind).increment(1));
    }

    /// Records one committed event of a group.
    pub(crate) fn group_event(&self, stream: &StreamName, group: &GroupName, e: &Event) {
        let (s, g) = (stream.to_string(), group.to_string());
        let kind = event_kind(e);
        self.record(|| {
            match e {
                Event::MemberExpired(_) => {
                    counter!(names::MEMBERS_EXPIRED, "stream" => s.clone(), "group" => g.clone()).increment(1)
                }
                Event::MemberFenced { .. } => {
                    counter!(names::MEMBERS_FENCED, "stream" => s.clone(), "group" => g.clone()).increment(1)
                }
                Event::RegressionReported { .. } => {
                    counter!(names::CLIENT_VERSION_AHEAD, "stream" => s.clone(), "group" => g.clone()).increment(1)
                }
                Event::CorrectionOpened { .. } => {
                    counter!(names::CORRECTIONS_OPENED, "stream" => s.clone(), "group" => g.clone()).increment(1)
                }
                Event::ChildrenReleased { waited_ms, .. } => {
                    histogram!(names::RESHARD_CHILDREN_WAIT, "stream" => s.clone(), "group" => g.clone())
                        .record(*waited_ms as f64 / 1000.0)
                }
                _ => {}
            }
            counter!(names::GROUP_EVENTS, "stream" => s, "group" => g, "event" => kind).increment(1);
        });
    }

    /// Sets the per-group gauges from what a tick loaded: the metadata, the liveness hash and Redis time.
    pub(crate) fn observe_group(&self, meta: &GroupMetadata, live: &Liveness, now_ms: u64) {
        let (s, g) = (meta.stream.to_string(), meta.group.to_string());
        let ttl = meta.timings.member_ttl_ms;
        let mut ages: Vec<u64> = Vec::new();
        let mut fenced = 0u32;
        let mut oldest_drain: Option<u64> = None;
        for (id, m) in &meta.members {
            if m.fenced_at_ms.is_some() {
                fenced += 1;
                continue;
            }
            // A renewal writes `now + ttl` as the lease end, so the last renewal was `lease end - ttl`.
            let lease_end = live.get(id).copied().unwrap_or(0).max(m.lease_until_ms);
            ages.push(now_ms.saturating_sub(lease_end.saturating_sub(ttl)));
            if let Some(since) = m.revoking_since_ms {
                oldest_drain = Some(oldest_drain.map_or(since, |o| o.min(since)));
            }
        }
        ages.sort_unstable();
        let max_age = ages.last().copied().unwrap_or(0);
        let median_age = ages.get(ages.len() / 2).copied().unwrap_or(0);
        let revoking = meta
            .shards
            .iter()
            .filter(|sh| sh.owner.is_some() && sh.owner != sh.target)
            .count();
        let unowned = meta
            .shards
            .iter()
            .filter(|sh| sh.target.is_some() && sh.owner.is_none())
            .count();
        let secs = |ms: u64| ms as f64 / 1000.0;
        let correction_age = meta
            .correction
            .as_ref()
            .map_or(0, |r| now_ms.saturating_sub(r.started_at_ms));
        let first_sight = self
            .seen_groups
            .lock()
            .expect("seen groups lock")
            .insert((s.clone(), g.clone()));
        self.record(|| {
            let labels = [("stream", s.clone()), ("group", g.clone())];
            gauge!(names::HEARTBEAT_AGE_MAX, &labels).set(secs(max_age));
            gauge!(names::HEARTBEAT_AGE_MEDIAN, &labels).set(secs(median_age));
            gauge!(names::MEMBERS, &labels).set(ages.len() as f64);
            gauge!(names::FENCED_MEMBERS, &labels).set(f64::from(fenced));
            gauge!(names::SHARDS_REVOKING, &labels).set(revoking as f64);
            gauge!(names::SHARDS_UNOWNED, &labels).set(unowned as f64);
            gauge!(names::REVOKE_AGE_MAX, &labels).set(secs(oldest_drain.map_or(0, |o| now_ms.saturating_sub(o))));
            gauge!(names::CORRECTION_OPEN, &labels).set(if meta.correction.is_some() { 1.0 } else { 0.0 });
            gauge!(names::CORRECTION_AGE, &labels).set(secs(correction_age));
            gauge!(names::METADATA_VERSION, &labels).set(meta.metadata_version.0 as f64);
            gauge!(names::RESHARD_PARENTS_NOT_DRAINED, &labels)
                .set(crate::state_machine::reshard::parents_not_drained(meta) as f64);
            if first_sight {
                for name in [
                    names::MEMBERS_EXPIRED,
                    names::MEMBERS_FENCED,
                    names::CLIENT_VERSION_AHEAD,
                    names::CORRECTIONS_OPENED,
                ] {
                    counter!(name, &labels).increment(0);
                }
                // Registered empty, so the family is there before the first growth.
                let _ = histogram!(names::RESHARD_CHILDREN_WAIT, &labels);
            }
        });
    }

    /// Drains histogram samples into their buckets so memory stays bounded between scrapes (the tick calls it;
    /// `build_recorder` starts no upkeep thread of its own).
    pub(crate) fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// Renders `/metrics`: refreshes the lag from `store` (see [`LAG_MIN_REFRESH`]), copies the atomic counters
    /// (`totals`) and the instance state into the recorder, then renders the Prometheus text format.
    pub async fn render(&self, store: &Store, totals: Totals, terminating: bool, in_flight: usize) -> String {
        self.refresh_lag(store).await;
        self.render_with(&totals, terminating, in_flight)
    }

    fn render_with(&self, totals: &Totals, terminating: bool, in_flight: usize) -> String {
        self.record(|| {
            gauge!(names::TERMINATING).set(if terminating { 1.0 } else { 0.0 });
            match self.eviction_policy.load(Ordering::Relaxed) {
                1 => gauge!(names::EVICTION_POLICY_UNSAFE).set(0.0),
                2 => gauge!(names::EVICTION_POLICY_UNSAFE).set(1.0),
                _ => {}
            }
            gauge!(names::SECTIONS_IN_FLIGHT).set(in_flight as f64);
            counter!(names::MUTEX_BUSY).absolute(totals.mutex_busy);
            counter!(names::HEARTBEAT_BATCHES).absolute(totals.heartbeat_batches);
            counter!(names::HEARTBEATS_BATCHED).absolute(totals.heartbeats_batched);
            counter!(names::MUTEX_TIMEOUTS).absolute(totals.mutex_timeouts);
            counter!(names::REVISION_CONFLICTS).absolute(totals.revision_conflicts);
            counter!(names::METADATA_REGRESSIONS).absolute(totals.metadata_regressions);
            counter!(names::ROUTING_VERSION_AHEAD).absolute(totals.routing_regressions);
            counter!(names::METADATA_UNAVAILABLE).absolute(totals.metadata_unavailable);
            counter!(names::REDIS_RESTARTS).absolute(totals.redis_restarts);
            counter!(names::TICK_VISITS, "reason" => "due").absolute(totals.tick_visits_due);
            counter!(names::TICK_VISITS, "reason" => "sweep").absolute(totals.tick_visits_sweep);
            counter!(names::COMPATIBILITY_FAILURES, "phase" => "startup").absolute(startup_compatibility_failures());
        });
        self.handle.render()
    }

    /// Scrapes `XINFO GROUPS` and `XLEN` of every shard of every indexed stream, unless a scrape finished less
    /// than [`LAG_MIN_REFRESH`] ago. Concurrent callers wait for one scrape.
    async fn refresh_lag(&self, store: &Store) {
        let mut last = self.lag_scraped.lock().await;
        if !last.due(LAG_MIN_REFRESH) {
            return;
        }
        let started = Instant::now();
        let result = tokio::time::timeout(LAG_SCRAPE_TIMEOUT, store.scrape_lag()).await;
        let samples = match result {
            Ok(Ok(samples)) => samples,
            Ok(Err(e)) => {
                warn!(error = %e, "lag scrape failed; serving the previous values");
                self.record(|| counter!(names::LAG_SCRAPE_ERRORS).increment(1));
                return;
            }
            Err(_) => {
                warn!(
                    timeout_ms = LAG_SCRAPE_TIMEOUT.as_millis() as u64,
                    "lag scrape timed out"
                );
                self.record(|| counter!(names::LAG_SCRAPE_ERRORS).increment(1));
                return;
            }
        };
        last.mark();
        self.record(|| {
            for s in &samples.shards {
                let labels = [("stream", s.stream.clone()), ("shard", s.shard.0.to_string())];
                gauge!(names::SHARD_LENGTH, &labels).set(s.length as f64);
            }
            for s in &samples.groups {
                let labels = [
                    ("stream", s.stream.clone()),
                    ("group", s.group.clone()),
                    ("shard", s.shard.0.to_string()),
                ];
                if let Some(lag) = s.lag {
                    gauge!(names::SHARD_LAG, &labels).set(lag as f64);
                }
                gauge!(names::SHARD_PENDING, &labels).set(s.pending as f64);
            }
            gauge!(names::LAG_SCRAPE_DURATION).set(started.elapsed().as_secs_f64());
        });
    }
}

/// The label value of an event: its variant name in snake case. Derived from `Debug` so that a new event kind
/// shows up in `/metrics` without touching this file.
fn event_kind(e: &Event) -> String {
    let debug = format!("{e:?}");
    let name = debug
        .split(|c: char| !c.is_ascii_alphanumeric())
        .next()
        .unwrap_or_default();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Pending and lag of one Redis consumer group on one shard stream, for the status page.
#[derive(Debug, Clone, Copy)]
pub struct ShardBacklog {
    /// Entries delivered but not acknowledged.
    pub pending: u64,
    /// Entries not yet delivered (absent when Redis cannot tell).
    pub lag: Option<u64>,
}

/// The backlog of every indexed group, keyed by (stream, group, shard): the scrape of the lag metrics, bounded by
/// [`LAG_SCRAPE_TIMEOUT`]. `None` when the scrape failed or timed out (the page then shows no backlog).
pub async fn shard_backlog(store: &Store) -> Option<BTreeMap<(String, String, u32), ShardBacklog>> {
    let samples = match tokio::time::timeout(LAG_SCRAPE_TIMEOUT, store.scrape_lag()).await {
        Ok(Ok(samples)) => samples,
        Ok(Err(e)) => {
            debug!(error = %e, "backlog scrape for the status page failed");
            return None;
        }
        Err(_) => {
            debug!("backlog scrape for the status page timed out");
            return None;
        }
    };
    Some(
        samples
            .groups
            .into_iter()
            .map(|g| {
                let backlog = ShardBacklog {
                    pending: g.pending,
                    lag: g.lag,
                };
                ((g.stream, g.group, g.shard.0), backlog)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests;
